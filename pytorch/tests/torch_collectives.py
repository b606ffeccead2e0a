"""Every torch.distributed call on the backend "troupe" against the same call
on gloo (same inputs, same results), and against a reference computed from
every rank's inputs where gloo (PyTorch 1.13) lacks the call, the dtype or
the reduce op. Run on 2 and 4 processes: launch.py -n N torch_collectives.py
"""

import functools
from datetime import timedelta
import operator

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from troupe_test import ALL_DTYPES, COMPLEX, FLOATS, GLOO_DTYPES, INTS, Cases, assert_same, data, finish, init

rank, n, gloo = init()
troupe_pg = c10d._get_default_group()
cases = Cases()
Op = dist.ReduceOp
SHAPE = (3, 5)


def exact_for(dtype, op):
    """Whether troupe and gloo (or the reference) must agree bit for bit."""
    if dtype in INTS or dtype == torch.bool or op in (Op.MIN, Op.MAX):
        return True
    return n == 2 and op == Op.SUM  # a sum of two terms does not depend on the order


def reference(op, dtype, salt, shape=SHAPE):
    xs = [data(q, shape, dtype, salt) for q in range(n)]
    if dtype == torch.bool:
        if op in (Op.SUM, Op.MAX, Op.BOR):
            return functools.reduce(torch.logical_or, xs)
        if op in (Op.PRODUCT, Op.MIN, Op.BAND):
            return functools.reduce(torch.logical_and, xs)
        return functools.reduce(torch.logical_xor, xs)
    if dtype in INTS:
        f = {Op.SUM: operator.add, Op.PRODUCT: operator.mul, Op.MIN: torch.minimum,
             Op.MAX: torch.maximum, Op.BAND: torch.bitwise_and, Op.BOR: torch.bitwise_or,
             Op.BXOR: torch.bitwise_xor}[op]
        return functools.reduce(f, xs)
    wide = torch.complex128 if dtype in COMPLEX else torch.float64
    ws = [x.to(wide) for x in xs]
    if op == Op.SUM:
        r = sum(ws)
    elif op == Op.AVG:
        r = sum(ws) / n
    elif op == Op.PRODUCT:
        r = functools.reduce(operator.mul, ws)
    elif op == Op.MIN:
        r = functools.reduce(torch.minimum, ws)
    elif op == Op.MAX:
        r = functools.reduce(torch.maximum, ws)
    else:
        raise ValueError(op)
    return r.to(dtype)


def ops_for(dtype):
    if dtype == torch.bool or dtype in INTS:
        return [Op.SUM, Op.PRODUCT, Op.MIN, Op.MAX, Op.BAND, Op.BOR, Op.BXOR]
    if dtype in COMPLEX:
        return [Op.SUM, Op.PRODUCT]
    return [Op.SUM, Op.AVG, Op.PRODUCT, Op.MIN, Op.MAX]


def op_name(op):
    for name in ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]:
        if op == getattr(Op, name):
            return name
    return str(op)


def gloo_has(dtype, op=Op.SUM):
    return dtype in GLOO_DTYPES and op != Op.AVG


@cases
def all_reduce_every_dtype_and_op():
    for i, dtype in enumerate(ALL_DTYPES):
        for j, op in enumerate(ops_for(dtype)):
            what = f"all_reduce {dtype} {op_name(op)}"
            salt = 1000 + 10 * i + j
            t = data(rank, SHAPE, dtype, salt)
            if dtype in COMPLEX:  # torch.distributed views complex as real; call the group itself
                opts = dist.AllreduceOptions()
                opts.reduceOp = op
                troupe_pg.allreduce([t], opts).wait()
            else:
                dist.all_reduce(t, op=op)
            if gloo_has(dtype, op) and dtype not in COMPLEX:
                g = data(rank, SHAPE, dtype, salt)
                dist.all_reduce(g, op=op, group=gloo)
                assert_same(t, g, what + " (troupe vs gloo)", exact_for(dtype, op))
            else:
                assert_same(t, reference(op, dtype, salt), what + " (troupe vs reference)",
                            exact_for(dtype, op) and dtype not in FLOATS)


@cases
def all_reduce_premul_sum():
    for dtype in [torch.float32, torch.float64]:
        t = data(rank, SHAPE, dtype, 5)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.25))
        ref = (sum(data(q, SHAPE, dtype, 5).double() * 0.25 for q in range(n))).to(dtype)
        assert_same(t, ref, f"all_reduce PREMUL_SUM(0.25) {dtype}", exact=False)


@cases
def all_reduce_large_and_empty():
    for numel in [0, 1, 3 << 20]:
        t = data(rank, (numel,), torch.float32, 11)
        g = t.clone()
        dist.all_reduce(t)
        dist.all_reduce(g, group=gloo)
        assert_same(t, g, f"all_reduce of {numel} float32", exact=(n == 2))


@cases
def all_reduce_coalesced():
    ts = [data(rank, (4,), torch.float32, 21), data(rank, (2, 3), torch.float32, 22)]
    gs = [t.clone() for t in ts]
    dist.all_reduce_coalesced(ts)
    dist.all_reduce_coalesced(gs, group=gloo)
    assert_same(ts, gs, "all_reduce_coalesced", exact=(n == 2))


@cases
def broadcast_every_dtype_and_root():
    for dtype in ALL_DTYPES:
        for src in sorted({0, n - 1}):
            t = data(rank, SHAPE, dtype, 31)
            if dtype in COMPLEX:
                opts = dist.BroadcastOptions()
                opts.rootRank = src
                troupe_pg.broadcast([t], opts).wait()
            else:
                dist.broadcast(t, src)
            if dtype in GLOO_DTYPES:
                g = data(rank, SHAPE, dtype, 31)
                dist.broadcast(g, src, group=gloo)
                assert_same(t, g, f"broadcast {dtype} from {src} (troupe vs gloo)")
            assert_same(t, data(src, SHAPE, dtype, 31), f"broadcast {dtype} from {src}")


@cases
def reduce_to_each_root():
    for dtype in [torch.int32, torch.float32, torch.float64]:
        for op in [Op.SUM, Op.MAX]:
            for dst in range(n):
                t = data(rank, SHAPE, dtype, 41)
                g = t.clone()
                dist.reduce(t, dst, op=op)
                dist.reduce(g, dst, op=op, group=gloo)
                if rank == dst:
                    assert_same(t, g, f"reduce {dtype} {op_name(op)} to {dst}", exact_for(dtype, op))


@cases
def all_gather_every_dtype():
    for dtype in ALL_DTYPES:
        x = data(rank, SHAPE, dtype, 51)
        outs = [torch.empty(SHAPE, dtype=dtype) for _ in range(n)]
        if dtype in COMPLEX:
            troupe_pg.allgather([outs], [x]).wait()
        else:
            dist.all_gather(outs, x)
        assert_same(outs, [data(q, SHAPE, dtype, 51) for q in range(n)], f"all_gather {dtype}")
        if dtype in GLOO_DTYPES:
            gouts = [torch.empty(SHAPE, dtype=dtype) for _ in range(n)]
            dist.all_gather(gouts, x, group=gloo)
            assert_same(outs, gouts, f"all_gather {dtype} (troupe vs gloo)")


@cases
def all_gather_base():
    # gloo 1.13: "no support for _allgather_base in Gloo process group"
    for dtype in [torch.bool, torch.int64, torch.bfloat16, torch.float32]:
        x = data(rank, (2, 3), dtype, 61)
        out = torch.empty((2 * n, 3), dtype=dtype)
        dist._all_gather_base(out, x)
        assert_same(out, torch.cat([data(q, (2, 3), dtype, 61) for q in range(n)]),
                    f"_all_gather_base {dtype}")


@cases
def all_gather_coalesced():
    xs = [data(rank, (3,), torch.int64, 71), data(rank, (2, 2), torch.int64, 72)]
    outs = [[torch.empty_like(x) for x in xs] for _ in range(n)]
    gouts = [[torch.empty_like(x) for x in xs] for _ in range(n)]
    dist.all_gather_coalesced(outs, xs)
    dist.all_gather_coalesced(gouts, xs, group=gloo)
    for q in range(n):
        assert_same(outs[q], gouts[q], f"all_gather_coalesced from rank {q}")
        assert_same(outs[q][1], data(q, (2, 2), torch.int64, 72), "all_gather_coalesced int64")


@cases
def gather_and_scatter_each_root():
    for root in range(n):
        x = data(rank, SHAPE, torch.float32, 81)
        outs = [torch.empty(SHAPE) for _ in range(n)] if rank == root else None
        gouts = [torch.empty(SHAPE) for _ in range(n)] if rank == root else None
        dist.gather(x, outs, dst=root)
        dist.gather(x, gouts, dst=root, group=gloo)
        if rank == root:
            assert_same(outs, gouts, f"gather to {root}")
            assert_same(outs, [data(q, SHAPE, torch.float32, 81) for q in range(n)], "gather")
        ins = [data(q, SHAPE, torch.int64, 82 + root) for q in range(n)] if rank == root else None
        out, gout = torch.empty(SHAPE, dtype=torch.int64), torch.empty(SHAPE, dtype=torch.int64)
        dist.scatter(out, ins, src=root)
        dist.scatter(gout, ins, src=root, group=gloo)
        assert_same(out, gout, f"scatter from {root} (troupe vs gloo)")
        assert_same(out, data(rank, SHAPE, torch.int64, 82 + root), f"scatter from {root}")


@cases
def reduce_scatter_list_and_base():
    # gloo 1.13 has neither: the reference is the sum of every rank's blocks.
    for dtype, op in [(torch.float32, Op.SUM), (torch.int32, Op.MAX), (torch.float64, Op.AVG),
                      (torch.bfloat16, Op.SUM)]:
        ins = [data(rank, (4,), dtype, 90 + q) for q in range(n)]
        out = torch.empty(4, dtype=dtype)
        dist.reduce_scatter(out, ins, op=op)
        # Rank r's result reduces block r of every rank's list.
        blocks = [data(q, (4,), dtype, 90 + rank) for q in range(n)]
        exact = exact_for(dtype, op) and dtype not in FLOATS
        assert_same(out, _reduce(blocks, op, dtype), f"reduce_scatter {dtype} {op_name(op)}", exact)
        flat = data(rank, (4 * n,), dtype, 95)
        out = torch.empty(4, dtype=dtype)
        dist._reduce_scatter_base(out, flat, op=op)
        blocks = [data(q, (4 * n,), dtype, 95)[4 * rank:4 * rank + 4] for q in range(n)]
        assert_same(out, _reduce(blocks, op, dtype), f"_reduce_scatter_base {dtype} {op_name(op)}", exact)


def _reduce(blocks, op, dtype):
    if op == Op.MAX:
        return functools.reduce(torch.maximum, blocks)
    s = sum(b.double() for b in blocks)
    return (s / n if op == Op.AVG else s).to(dtype)


@cases
def all_to_all_single_even_and_uneven():
    for dtype in [torch.float32, torch.int64, torch.float16]:
        x = data(rank, (2 * n, 3), dtype, 101)
        out, gout = torch.empty_like(x), torch.empty_like(x)
        dist.all_to_all_single(out, x)
        dist.all_to_all_single(gout, x, group=gloo)
        assert_same(out, gout, f"all_to_all_single even {dtype}")
    # Uneven: rank r sends q + r + 1 rows to rank q (and some send nothing).
    send = [(q + rank) % 3 for q in range(n)]
    recv = [(rank + q) % 3 for q in range(n)]
    x = data(rank, (sum(send), 2), torch.float32, 102)
    out = torch.empty((sum(recv), 2))
    gout = torch.empty((sum(recv), 2))
    dist.all_to_all_single(out, x, recv, send)
    dist.all_to_all_single(gout, x, recv, send, group=gloo)
    assert_same(out, gout, f"all_to_all_single uneven (send {send}, receive {recv})")
    expect = []
    for q in range(n):
        qs = [(p + q) % 3 for p in range(n)]
        start = sum(qs[:rank])
        expect.append(data(q, (sum(qs), 2), torch.float32, 102)[start:start + qs[rank]])
    assert_same(out, torch.cat(expect), "all_to_all_single uneven (reference)")


@cases
def all_to_all_list_uneven():
    # gloo 1.13 has no alltoall of lists: the reference is every rank's inputs.
    ins = [data(rank, (q + 1,), torch.float32, 110 + q) for q in range(n)]
    outs = [torch.empty(rank + 1) for _ in range(n)]
    dist.all_to_all(outs, ins)
    assert_same(outs, [data(q, (rank + 1,), torch.float32, 110 + rank) for q in range(n)],
                "all_to_all of uneven lists")


@cases
def barrier_and_monitored_barrier():
    # torch 1.13's dist.monitored_barrier lets only gloo through; the group's own call is there.
    store = c10d._get_default_store()
    monitored = lambda: troupe_pg.monitored_barrier(timeout=timedelta(seconds=30))  # noqa: E731
    for i, barrier in enumerate([dist.barrier, monitored] * 2):
        store.add(f"arrived/{i}", 1)
        barrier()
        # Every rank counted itself before anyone passed the barrier.
        arrived = store.add(f"arrived/{i}", 0)
        assert arrived == n, f"barrier {i} let rank {rank} pass with {arrived} of {n} arrived"


@cases
def send_recv_ring_and_tags():
    nxt, prev = (rank + 1) % n, (rank - 1) % n
    for dtype in [torch.float32, torch.int64, torch.bool, torch.bfloat16]:
        x = data(rank, SHAPE, dtype, 121)
        y = torch.empty(SHAPE, dtype=dtype)
        if rank % 2 == 0:
            dist.send(x, nxt)
            dist.recv(y, prev)
        else:
            dist.recv(y, prev)
            dist.send(x, nxt)
        assert_same(y, data(prev, SHAPE, dtype, 121), f"recv {dtype} from {prev}")
    # Tags keep two messages apart even when received in the other order.
    a, b = torch.full((2,), float(rank)), torch.full((2,), float(rank + 100))
    ra, rb = torch.empty(2), torch.empty(2)
    reqs = [dist.isend(a, nxt, tag=1), dist.isend(b, nxt, tag=2)]
    dist.recv(rb, prev, tag=2)
    dist.recv(ra, prev, tag=1)
    for r in reqs:
        r.wait()
    assert_same(ra, torch.full((2,), float(prev)), "recv tag 1")
    assert_same(rb, torch.full((2,), float(prev + 100)), "recv tag 2")


@cases
def recv_from_any_source():
    if rank == 0:
        got = set()
        for _ in range(n - 1):
            y = torch.empty(3)
            src = dist.recv(y)  # any source
            assert_same(y, torch.full((3,), float(src)), f"message from {src}")
            got.add(src)
        assert got == set(range(1, n)), f"recv any source got {sorted(got)}"
    else:
        dist.send(torch.full((3,), float(rank)), 0)
    # The same on gloo gives the same senders.
    if rank == 0:
        got = {dist.recv(torch.empty(3), group=gloo) for _ in range(n - 1)}
        assert got == set(range(1, n)), f"gloo: {got}"
    else:
        dist.send(torch.full((3,), float(rank)), 0, group=gloo)


@cases
def batch_isend_irecv_ring():
    nxt, prev = (rank + 1) % n, (rank - 1) % n
    x, y = data(rank, (5,), torch.float64, 131), torch.empty(5, dtype=torch.float64)
    ops = [dist.P2POp(dist.isend, x, nxt), dist.P2POp(dist.irecv, y, prev)]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    assert_same(y, data(prev, (5,), torch.float64, 131), "batch_isend_irecv")


@cases
def object_collectives():
    obj = {"rank": rank, "name": f"r{rank}", "values": list(range(rank + 1))}
    for group in [None, gloo]:
        objs = [None] * n
        dist.all_gather_object(objs, obj, group=group)
        assert objs == [{"rank": q, "name": f"r{q}", "values": list(range(q + 1))} for q in range(n)], objs
    lst = [obj, rank * 10] if rank == n - 1 else [None, None]
    dist.broadcast_object_list(lst, src=n - 1)
    assert lst[1] == (n - 1) * 10 and lst[0]["rank"] == n - 1, lst
    out = [None] * n if rank == 0 else None
    dist.gather_object(obj["name"], out, dst=0)
    if rank == 0:
        assert out == [f"r{q}" for q in range(n)], out
    recv = [None]
    dist.scatter_object_list(recv, [f"for {q}" for q in range(n)] if rank == 0 else None, src=0)
    assert recv == [f"for {rank}"], recv


@cases
def async_work_and_futures():
    t = data(rank, (6,), torch.float32, 141)
    g = t.clone()
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future().then(lambda f: f.value()[0] * 2)
    work.wait()
    # (torch 1.13 cannot return Work.exception() to Python: its binding lacks the type.)
    assert work.is_completed() and work.is_success()
    dist.all_reduce(g, group=gloo)
    assert_same(t, g, "async all_reduce", exact=(n == 2))
    assert_same(fut.wait(), g * 2, "get_future().then(...)", exact=(n == 2))
    # Several in flight, waited out of order, through the future only.
    ts = [data(rank, (3,), torch.float64, 150 + i) for i in range(5)]
    futs = [dist.all_reduce(x, async_op=True).get_future() for x in ts]
    for i in reversed(range(5)):
        v = futs[i].wait()[0]
        ref = sum(data(q, (3,), torch.float64, 150 + i) for q in range(n))
        assert_same(v, ref, f"future {i}", exact=False)
    # Futures of calls with several output lists, as gloo gives them.
    outs = [torch.empty(3) for _ in range(n)]
    v = dist.all_gather(outs, torch.full((3,), float(rank)), async_op=True).get_future().wait()
    gv = dist.all_gather([torch.empty(3) for _ in range(n)], torch.full((3,), float(rank)),
                         group=gloo, async_op=True).get_future().wait()
    assert_same(v[0] if isinstance(v[0], list) else v, gv[0] if isinstance(gv[0], list) else gv,
                "all_gather future value")


@cases
def sequence_numbers():
    def everyone(x):
        objs = [None] * n
        dist.all_gather_object(objs, x, group=gloo)
        return objs
    start = troupe_pg._get_sequence_number_for_group()
    assert len(set(everyone(start))) == 1, f"ranks disagree on the sequence number: {everyone(start)}"
    for i in range(3):
        dist.all_reduce(torch.ones(1))
        seq = troupe_pg._get_sequence_number_for_group()
        assert seq == start + i + 1, f"after {i + 1} all_reduce: {seq}, started at {start}"


@cases
def subgroups():
    members = list(range(0, n, 2)) if n > 2 else [0, 1]
    sub = dist.new_group(members)
    gsub = dist.new_group(members, backend="gloo")
    others = dist.new_group([r for r in range(n) if r not in members] or [0])
    if rank in members:
        t = data(rank, (4,), torch.float32, 161)
        g = t.clone()
        dist.all_reduce(t, group=sub)
        dist.all_reduce(g, group=gsub)
        assert_same(t, g, f"all_reduce on subgroup {members}", exact=(len(members) == 2))
        assert dist.get_world_size(sub) == len(members)
        assert dist.get_rank(sub) == members.index(rank)
        assert sub._get_sequence_number_for_group() == 1
    if others is not None and others != dist.GroupMember.NON_GROUP_MEMBER:
        y = torch.full((2,), float(rank))
        dist.broadcast(y, src=min(r for r in range(n) if r not in members) if n > 2 else 0,
                       group=others)


if __name__ == "__main__":
    cases.run(sync_group=gloo)
    finish(gloo)
