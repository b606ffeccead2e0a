#!/usr/bin/env python3
"""The PyTorch side of gpu_bench's part 2: a 4-byte allreduce (one float32)
through torch.distributed's ProcessGroupNCCL with one rank on cuda:0, each
call followed by torch.cuda.synchronize() (troupe's pg.allreduce(t).wait()
also returns once the GPU is done), timed with the host clock; the median in
microseconds. bench/run_gpu_bench.sh runs it when PyTorch sees a GPU and
passes the number to gpu_bench as --torch-us.

    python3 bench/torch_nccl_bench.py [--warmup N] [--iters N]

Prints a line "torch_nccl_4B_us <median>" (the one the script reads) after a
line naming the versions.
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args()
    if args.iters < 1 or args.warmup < 0:
        ap.error("--iters must be >= 1 and --warmup >= 0")

    torch.cuda.set_device(0)
    # One rank: an in-memory store is all the rendezvous it needs.
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    t = torch.full((1,), 3.5, dtype=torch.float32, device="cuda:0")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    if t.item() != 3.5:
        raise SystemExit(f"torch_nccl_bench: allreduce of one rank gave {t.item()}, expected 3.5")

    for _ in range(args.warmup):
        dist.all_reduce(t)
        torch.cuda.synchronize()
    us = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        dist.all_reduce(t)
        torch.cuda.synchronize()
        us.append((time.perf_counter() - t0) * 1e6)
    dist.destroy_process_group()

    v = torch.cuda.nccl.version()  # a tuple in recent releases, an int before
    nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    print(f"torch {torch.__version__}, NCCL {nccl}, {torch.cuda.get_device_name(0)}: "
          f"{args.iters} timed all_reduce + synchronize after {args.warmup} warm-up")
    print(f"torch_nccl_4B_us {statistics.median(us):.3f}")


if __name__ == "__main__":
    main()
