"""Errors on the backend "troupe" reach Python as RuntimeError with troupe's
message, as they do in C++: a bad argument, ranks that disagree (mismatch),
a rank that never joins (timeout), a Work.wait that runs out of time, and a
rank whose process dies (peer failure). The last rank ends with exit code 3
on purpose: launch.py -n N --expect-exit N-1:3 torch_errors.py
"""

import os
import time
from datetime import timedelta

import warnings

import torch
import torch.distributed as dist

from troupe_test import Cases, init

rank, n, gloo = init()
warnings.filterwarnings("ignore", message="ComplexHalf")
cases = Cases()


def raises(fn, *needles):
    """fn() raises RuntimeError whose message contains every needle; returns the message."""
    try:
        fn()
    except RuntimeError as e:
        msg = str(e)
        for s in needles:
            assert s in msg, f"expected {s!r} in the error, got: {msg}"
        return msg
    raise AssertionError(f"expected a RuntimeError containing {needles}, nothing was raised")


@cases
def bad_arguments_name_the_call_and_value():
    raises(lambda: dist.all_reduce(torch.ones(4, 4).t()), "allreduce", "not contiguous")
    raises(lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.AVG),
           "AVG", "int32")
    raises(lambda: dist.broadcast(torch.ones(2), src=n + 5), "broadcast", str(n + 5))
    # torch.distributed views complex tensors as real ones; the group itself sees the dtype.
    pg = dist.distributed_c10d._get_default_group()
    raises(lambda: pg.allreduce([torch.zeros(2, dtype=torch.complex32)]), "ComplexHalf", "troupe")
    # The group still works afterwards.
    t = torch.ones(2)
    dist.all_reduce(t)
    assert t.tolist() == [n, n], t


@cases
def mismatch_fails_every_rank_alike():
    t = torch.ones(4 if rank == 0 else 3)
    msg = raises(lambda: dist.all_reduce(t), "allreduce", "mismatch", "4 float32", "3 float32")
    msgs = [None] * n  # the same cause on every rank (each names its own rank first)
    dist.all_gather_object(msgs, msg.split("failed: ")[-1], group=gloo)
    assert len(set(msgs)) == 1, f"ranks report the mismatch differently: {msgs}"
    d = torch.ones(2, dtype=torch.float64 if rank == 0 else torch.float32)
    raises(lambda: dist.all_reduce(d), "float64", "float32")


@cases
def the_group_after_a_mismatch():
    # Which is right: does the group go on after a mismatch, or does it
    # refuse every later call naming the first failure?
    t = torch.ones(2)
    try:
        dist.all_reduce(t)
        outcome = "goes on"
        assert t.tolist() == [n, n], t
    except RuntimeError as e:
        outcome = "stopped: " + str(e).split("\n")[0]
    outcomes = [None] * n
    dist.all_gather_object(outcomes, outcome, group=gloo)
    if rank == 0:
        print(f"after a mismatch the default group {outcomes[0]}", flush=True)
    assert len(set(outcomes)) == 1, outcomes


@cases
def a_rank_that_never_joins_times_out():
    g = dist.new_group(list(range(n)), timeout=timedelta(seconds=2))
    if rank == 0:
        start = time.monotonic()
        raises(lambda: dist.all_reduce(torch.ones(1), group=g), "allreduce", "Timed out")
        assert time.monotonic() - start < 30
    dist.barrier(group=gloo)


@cases
def work_wait_with_a_timeout():
    g = dist.new_group(list(range(n)))
    t = torch.full((2,), float(rank))
    if rank == 0:
        w = dist.all_reduce(t, group=g, async_op=True)
        raises(lambda: w.wait(timeout=timedelta(milliseconds=300)), "Timed out")
        dist.barrier(group=gloo)  # now the others join
        w.wait()
        assert t.tolist() == [sum(range(n))] * 2, t
    else:
        dist.barrier(group=gloo)
        dist.all_reduce(t, group=g)


@cases
def a_dead_rank_fails_the_others():
    victim = n - 1
    if rank == victim:
        dist.barrier(group=gloo)
        os._exit(3)
    dist.barrier(group=gloo)
    time.sleep(0.5)
    msg = raises(lambda: dist.all_reduce(torch.ones(1)), "allreduce")
    assert str(victim) in msg and ("peer" in msg or "left" in msg or "died" in msg), msg
    print(f"rank {rank} saw: {msg.splitlines()[0]}", flush=True)


if __name__ == "__main__":
    cases.run(sync_group=None)
    os._exit(0)  # the dead rank left the gloo group unusable for a clean shutdown
