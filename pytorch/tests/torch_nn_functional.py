"""torch.distributed.nn.functional on the backend "troupe": the gradients
autograd computes through each differentiable collective equal those on
gloo (same inputs), and the analytic gradient where gloo lacks the
collective. The loss is sum over ranks of <w_r, y_r>: autograd on each
rank's part gives the gradient of the whole, because the collectives'
backward passes carry the other ranks' contributions.
"""

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as F

from troupe_test import Cases, assert_same, data, finish, init

rank, n, gloo = init()
cases = Cases()
Op = dist.ReduceOp
SH = (2, 3)


def leaf(salt, shape=SH, who=None):
    return data(rank if who is None else who, shape, torch.float64, salt).requires_grad_()


def weight(salt, shape=SH, who=None):
    return data(rank if who is None else who, shape, torch.float64, 500 + salt)


def loss_of(outputs, salt):
    """<w, y> over this rank's outputs (one tensor or a tuple)."""
    if isinstance(outputs, torch.Tensor):
        outputs = (outputs,)
    return sum((weight(salt + i, o.shape) * o).sum() for i, o in enumerate(outputs))


def grads(group, salt, forward, nleaves=1, shape=SH):
    xs = [leaf(salt + 50 * i, shape) for i in range(nleaves)]
    loss_of(forward(xs, group), salt).backward()
    return [x.grad for x in xs]


def compare(name, salt, forward, nleaves=1, shape=SH, reference=None):
    mine = grads(dist.group.WORLD, salt, forward, nleaves, shape)
    if reference is None:
        theirs = grads(gloo, salt, forward, nleaves, shape)
        assert_same(mine, theirs, f"{name}: gradient on troupe vs gloo", exact=(n == 2))
    else:
        assert_same(mine, reference, f"{name}: gradient on troupe vs the analytic one", exact=False)


@cases
def broadcast_gradients():
    compare("broadcast", 1, lambda xs, g: F.broadcast(xs[0], src=n - 1, group=g))


@cases
def gather_gradients():
    compare("gather", 2, lambda xs, g: F.gather(xs[0], dst=0, group=g))


@cases
def scatter_gradients():
    compare("scatter", 3, lambda xs, g: F.scatter(xs, src=0, group=g), nleaves=n)


@cases
def reduce_gradients():
    compare("reduce", 4, lambda xs, g: F.reduce(xs[0], dst=n - 1, op=Op.SUM, group=g))


@cases
def all_reduce_gradients():
    compare("all_reduce", 5, lambda xs, g: F.all_reduce(xs[0], op=Op.SUM, group=g))


@cases
def all_gather_gradients():
    # Its backward runs alltoall (through scatters on gloo).
    compare("all_gather", 6, lambda xs, g: F.all_gather(xs[0], group=g))


@cases
def all_to_all_gradients():
    def fwd(xs, g):
        return F.all_to_all([torch.empty(SH, dtype=torch.float64) for _ in range(n)], xs, group=g)
    compare("all_to_all", 7, fwd, nleaves=n)


@cases
def all_to_all_single_uneven_gradients():
    send = [(q + rank) % 3 + 1 for q in range(n)]
    recv = [(rank + q) % 3 + 1 for q in range(n)]

    def fwd(xs, g):
        out = torch.empty((sum(recv), 2), dtype=torch.float64)
        return F.all_to_all_single(out, xs[0], output_split_sizes=recv, input_split_sizes=send,
                                   group=g)
    compare("all_to_all_single", 8, fwd, shape=(sum(send), 2))


@cases
def reduce_scatter_gradients():
    # gloo 1.13 has no reduce_scatter: y_r = sum_q x_q[r], so the gradient of
    # rank q's x_q[r] is rank r's weight.
    def fwd(xs, g):
        return F.reduce_scatter(torch.empty(SH, dtype=torch.float64), xs, op=Op.SUM, group=g)
    ref = [weight(9, SH, who=r) for r in range(n)]
    compare("reduce_scatter", 9, fwd, nleaves=n, reference=ref)


if __name__ == "__main__":
    cases.run(sync_group=gloo)
    finish(gloo)
