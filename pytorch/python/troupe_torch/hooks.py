"""DDP comm hooks that let troupe do DDP's averaging inside the allreduce.

    from troupe_torch.hooks import allreduce_avg_hook
    model = DistributedDataParallel(module, gradient_as_bucket_view=True)
    model.register_comm_hook(None, allreduce_avg_hook)   # or a process group

Without a hook, torch's reducer divides every gradient by the world size
itself (a pass over every gradient inside the backward) and then sums the
buckets. ``allreduce_avg_hook`` hands each bucket undivided to one allreduce
with ``ReduceOp.AVG``: troupe divides while it writes the sum, so the
division costs no pass of its own. With ``gradient_as_bucket_view=True``
the gradients are the buckets, and DDP's copies into and out of them go as
well: what the step waits for is the communication alone.

The result equals the default hook's up to rounding (the sum is divided
once, instead of every term before the sum).
"""

import torch
import torch.distributed as dist

__all__ = ["allreduce_avg_hook"]


def allreduce_avg_hook(process_group, bucket):
    """Averages the bucket over ``process_group`` (None: the default group)
    with one allreduce of ``ReduceOp.AVG``; returns a future of the bucket."""
    buffer = bucket.buffer()
    work = dist.all_reduce(buffer, op=dist.ReduceOp.AVG, group=process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])
