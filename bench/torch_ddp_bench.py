"""torch_ddp_bench — one training step of torch's DistributedDataParallel on
the backend "troupe" against the same step on "gloo", in the same processes.

One rank per process, started with env:// (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), e.g. by pytorch/tests/launch.py or torchrun:

    PYTHONPATH=build/pytorch/python /usr/bin/python3 pytorch/tests/launch.py -n 2 \\
        bench/torch_ddp_bench.py [--rounds 7] [--models large,small] [--out FILE]
    ... bench/torch_ddp_bench.py --check-only     (tiny models, values only)

Models: MLPs of three Linear layers with ReLUs between them, "large"
(1024 -> 4096 -> 4096 -> 1024, 25.2 M float32 parameters, three DDP buckets
under c10d's default bucket sizes) and "small" (64 -> 256 -> 256 -> 64,
99 k parameters, one bucket); 32 samples per rank per step, mse loss, SGD
with momentum, one torch thread per process.

Rows, each round timing every row once (the order of the two backends
alternates from round to round):
  ddp troupe / ddp gloo  one step (zero_grad, forward, backward with DDP's
                         gradient synchronisation, optimizer step) of a DDP
                         replica whose process group is troupe's default
                         group or a gloo group over the same ranks;
  local                  the same step on a copy of the model without DDP
                         (no communication): the computation alone;
  ddp nocomm             the DDP step on troupe with a comm hook that hands
                         each bucket back at once (no communication, no
                         division): what DDP itself adds, torch's reducer
                         copying the gradients into the buckets and the
                         results back out (gradient_as_bucket_view off);
  sync troupe / gloo     the gradient synchronisation alone: the model's
                         gradients flattened into DDP's buckets (the sizes
                         dist._compute_bucket_assignment_by_size gives for
                         the parameters in reverse order with c10d's limits,
                         1 MiB first, then 25 MiB), every bucket's
                         allreduce (SUM) issued async, then all waited for.
Each time runs from a barrier (on a third, gloo group used only for the
bookkeeping) to the end of the step on that rank; a row's time in a round is
the slowest rank's. The tables show medians over the rounds; "exposed"
is the DDP step minus the local step of the same round (the part of the
synchronisation the backward does not hide); "exposed nocomm" the nocomm
step minus the local step (DDP's copies), and "exposed comm" the troupe
step minus the nocomm step (the communication left after the copies).

Checks (after the timed steps): the troupe replica's parameters equal the
gloo replica's bit for bit with 2 processes (a sum of two terms does not
depend on the order), within a tolerance with more; every rank holds rank
0's parameters; the bucket allreduces of both backends agree likewise.
"""

import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import troupe_torch  # noqa: F401  (registers the backend "troupe")
from troupe_torch.hooks import allreduce_avg_hook

warnings.filterwarnings("ignore", category=UserWarning, module="torch.distributed")

MODELS = {  # name: (input, hidden, output)
    "large": (1024, 4096, 1024),
    "small": (64, 256, 64),
}
CHECK_MODELS = {  # --check-only: several buckets still, in seconds
    "large": (256, 640, 256),  # 0.74 M parameters, two buckets
    "small": (16, 32, 8),
}
BATCH = 32
FIRST_BUCKET = 1024 * 1024
BUCKET_CAP = 25 * 1024 * 1024


def make_model(dims):
    i, h, o = dims
    torch.manual_seed(0)  # one start for every rank and every replica
    return nn.Sequential(nn.Linear(i, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, o))


def batches(dims, rank, count):
    out = []
    for k in range(count):
        g = torch.Generator().manual_seed(1000 * k + rank)
        out.append((torch.randn(BATCH, dims[0], generator=g),
                    torch.randn(BATCH, dims[2], generator=g)))
    return out


def nocomm_hook(state, bucket):
    """Hands the bucket back as it is: DDP's copies without communication."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def step(model, opt, x, y, tail=None):
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    if tail is not None:
        tail.clear()
    loss.backward()
    if tail is not None:
        # The exposed tail: from the last gradient the backward computed to
        # the end of the backward (DDP's last copies, the wait for the
        # buckets' allreduces, the copies back out).
        tail.append(time.perf_counter())
    opt.step()


def watch_gradients(model, tail):
    """Records in `tail` when each parameter's gradient is computed."""
    for p in model.parameters():
        p.register_hook(lambda g: tail.append(time.perf_counter()))


class Bench:
    def __init__(self, name, dims, gloo, rank, n):
        self.name, self.rank, self.n = name, rank, n
        base = make_model(dims)
        self.params = sum(p.numel() for p in base.parameters())
        self.ddp = {}
        self.opt = {}
        self.tails = {}
        for key, group, view in (("troupe", None, False), ("gloo", gloo, False),
                                 ("nocomm", None, False), ("view", None, True),
                                 ("nocomm view", None, True)):
            # None: the default group, troupe's
            m = DDP(make_model(dims), process_group=group, gradient_as_bucket_view=view)
            if key.startswith("nocomm"):
                m.register_comm_hook(None, nocomm_hook)
            elif key == "view":
                m.register_comm_hook(None, allreduce_avg_hook)
            self.ddp[key] = m
            self.tails[key] = []
            watch_gradients(m.module, self.tails[key])
            self.opt[key] = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        self.local = make_model(dims)
        self.tails["local"] = []
        watch_gradients(self.local, self.tails["local"])
        self.local_opt = torch.optim.SGD(self.local.parameters(), lr=0.01, momentum=0.9)
        self.data = batches(dims, rank, 4)
        self.steps = 0
        # The buckets of the synchronisation alone: the sizes DDP starts with.
        params = list(reversed(list(base.parameters())))
        indices, _ = dist._compute_bucket_assignment_by_size(params, [FIRST_BUCKET, BUCKET_CAP])
        self.bucket_sizes = [sum(params[i].numel() for i in b) for b in indices]
        g = torch.Generator().manual_seed(77 + rank)
        self.sources = [torch.randn(s, generator=g) for s in self.bucket_sizes]
        self.buckets = {k: [s.clone() for s in self.sources] for k in ("troupe", "gloo")}
        self.groups = {"troupe": None, "gloo": gloo}

    def ddp_step(self, key):
        x, y = self.data[self.steps % len(self.data)]
        step(self.ddp[key], self.opt[key], x, y, self.tails[key])

    def local_step(self):
        x, y = self.data[self.steps % len(self.data)]
        step(self.local, self.local_opt, x, y, self.tails["local"])

    def refill(self, key):
        for b, s in zip(self.buckets[key], self.sources):
            b.copy_(s)

    def sync(self, key):
        works = [dist.all_reduce(b, group=self.groups[key], async_op=True)
                 for b in self.buckets[key]]
        for w in works:
            w.wait()

    def rows(self, order):
        """(row name, function to time, function to run before it untimed)."""
        r = [(f"ddp {k}", (lambda k=k: self.ddp_step(k)), None) for k in order]
        r.append(("local", self.local_step, None))
        r.append(("ddp nocomm", lambda: self.ddp_step("nocomm"), None))
        r.append(("ddp view", lambda: self.ddp_step("view"), None))
        r.append(("ddp nocomm view", lambda: self.ddp_step("nocomm view"), None))
        r += [(f"sync {k}", (lambda k=k: self.sync(k)), (lambda k=k: self.refill(k)))
              for k in order]
        return r

    def check(self, ctl):
        """Raises when the replicas or the bucket sums disagree."""
        exact = self.n == 2
        pairs = [(f"parameter {i}", a.detach(), b.detach()) for i, (a, b) in enumerate(
            zip(self.ddp["troupe"].module.parameters(), self.ddp["gloo"].module.parameters()))]
        view = [(f"view parameter {i}", a.detach(), b.detach()) for i, (a, b) in enumerate(
            zip(self.ddp["view"].module.parameters(), self.ddp["troupe"].module.parameters()))]
        for what, a, b in view:  # the average divides once: equal up to rounding
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5,
                                       msg=lambda m: f"{self.name}: {what}: {m}")
        pairs += [(f"bucket {i}", a, b) for i, (a, b) in enumerate(
            zip(self.buckets["troupe"], self.buckets["gloo"]))]
        worst = 0.0
        for what, a, b in pairs:
            if exact:
                if not torch.equal(a, b):
                    raise AssertionError(f"{self.name}: {what}: troupe's differs from gloo's "
                                         f"(max |diff| {(a - b).abs().max().item():.3e})")
            else:
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5,
                                           msg=lambda m: f"{self.name}: {what}: {m}")
            worst = max(worst, (a - b).abs().max().item())
        for i, p in enumerate(self.ddp["troupe"].module.parameters()):
            ref = p.detach().clone()
            dist.broadcast(ref, 0, group=ctl)
            if not torch.equal(ref, p.detach()):
                raise AssertionError(f"{self.name}: rank {self.rank} parameter {i} "
                                     "differs from rank 0's")
        return worst


def timed(ctl, fn, before=None):
    if before is not None:
        before()
    dist.barrier(group=ctl)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def median(v):
    return statistics.median(v) if v else float("nan")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--models", default="large,small")
    p.add_argument("--check-only", action="store_true")
    p.add_argument("--out", help="rank 0 writes the per-round times here (JSON)")
    a = p.parse_args()
    if a.check_only:
        a.rounds, a.warmup = 1, 1

    torch.set_num_threads(1)
    dist.init_process_group("troupe")
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")  # DDP's gloo replica and the gloo allreduces
    ctl = dist.new_group(backend="gloo")   # barriers and the slowest rank's times only
    transport = os.environ.get("TROUPE_TRANSPORT", "shm")

    result = {"procs": n, "transport": transport, "batch": BATCH, "rounds": a.rounds,
              "check_only": a.check_only, "models": {}}
    dims_of = CHECK_MODELS if a.check_only else MODELS
    for name in a.models.split(","):
        b = Bench(name, dims_of[name], gloo, rank, n)
        names = None
        times = {}
        for r in range(a.warmup + a.rounds):
            order = ("troupe", "gloo") if r % 2 == 0 else ("gloo", "troupe")
            mine = {}
            for row, fn, before in b.rows(order):
                mine[row] = timed(ctl, fn, before)
            b.steps += 1
            names = names or sorted(mine)
            t = torch.tensor([mine[k] for k in names], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctl)
            # A step's tail on the rank whose backward ended last: the
            # synchronisation nothing hid (the others' tails also hold their
            # wait for that rank's computation).
            tails = torch.tensor([(tail[-1] - max(tail[:-1])) * 1e3
                                  for tail in b.tails.values()], dtype=torch.float64)
            dist.all_reduce(tails, op=dist.ReduceOp.MIN, group=ctl)
            if r >= a.warmup:
                for k, v in zip(names, t.tolist()):
                    times.setdefault(k, []).append(v)
                for k, v in zip(b.tails, tails.tolist()):
                    times.setdefault(f"tail {k}", []).append(v)
        worst = b.check(ctl)
        times["exposed troupe"] = [d - l for d, l in zip(times["ddp troupe"], times["local"])]
        times["exposed gloo"] = [d - l for d, l in zip(times["ddp gloo"], times["local"])]
        times["exposed nocomm"] = [d - l for d, l in zip(times["ddp nocomm"], times["local"])]
        times["exposed comm"] = [d - c for d, c in zip(times["ddp troupe"], times["ddp nocomm"])]
        times["exposed view"] = [d - l for d, l in zip(times["ddp view"], times["local"])]
        times["exposed nocomm view"] = [d - l for d, l in zip(times["ddp nocomm view"],
                                                                times["local"])]
        result["models"][name] = {"params": b.params, "buckets": b.bucket_sizes,
                                  "steps": b.steps, "max_abs_diff": worst, "times_ms": times}
        if rank == 0:
            print(f"{name}: {b.params} parameters, buckets {b.bucket_sizes} floats, "
                  f"{b.steps} steps; troupe and gloo agree "
                  f"({'bit for bit' if n == 2 else f'max |diff| {worst:.2e}'})", flush=True)
        del b

    if rank == 0:
        print_tables(result)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(result, f)
    dist.barrier(group=ctl)
    # As the torch tests do: no interpreter finalization while gloo's threads may still run.
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def print_tables(result):
    n = result["procs"]
    print(f"\n### torch DDP step, {n} processes (troupe over {result['transport']}, gloo over "
          f"TCP loopback), {result['batch']} samples per rank, median of {result['rounds']} "
          "rounds, slowest rank\n")
    print("| model | params | ddp troupe ms | ddp gloo ms | troupe / gloo | local ms | "
          "exposed troupe ms | exposed gloo ms | sync troupe ms | sync gloo ms | "
          "sync troupe / gloo |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, m in result["models"].items():
        t = {k: median(v) for k, v in m["times_ms"].items()}
        print(f"| {name} | {m['params'] / 1e6:.3f} M | {t['ddp troupe']:.2f} | "
              f"{t['ddp gloo']:.2f} | {t['ddp troupe'] / t['ddp gloo']:.2f} | {t['local']:.2f} | "
              f"{t['exposed troupe']:.2f} | {t['exposed gloo']:.2f} | {t['sync troupe']:.2f} | "
              f"{t['sync gloo']:.2f} | {t['sync troupe'] / t['sync gloo']:.2f} |")
    print("\nWhere troupe's exposed time goes, measured at the step's tail: from the last "
          "gradient the backward computed to the end of the backward, on the rank whose "
          "backward ended last (the synchronisation nothing hid; the difference of two whole "
          "steps drowns in the computation's spread). default: torch's reducer as it comes "
          "(it copies every gradient into the buckets, dividing, and the results back out); "
          "view: gradient_as_bucket_view=True with troupe_torch.hooks.allreduce_avg_hook (no "
          "copies, the division inside the allreduce); nocomm: the same without "
          "communication. exposed: tail minus the local step's tail.\n")
    print("| model | DDP | tail ms | tail nocomm ms | exposed ms | sync troupe ms | "
          "exposed / sync |")
    print("|---|---|---|---|---|---|---|")
    for name, m in result["models"].items():
        t = {k: median(v) for k, v in m["times_ms"].items()}
        for label, key, floor in (("default", "troupe", "nocomm"), ("view", "view", "nocomm view")):
            exposed = t[f"tail {key}"] - t["tail local"]
            print(f"| {name} | {label} | {t[f'tail {key}']:.2f} | {t[f'tail {floor}']:.2f} | "
                  f"{exposed:.2f} | {t['sync troupe']:.2f} | {exposed / t['sync troupe']:.2f} |")
    print("\nThe default's exposed time leaves out the copies into the buckets, which run "
          "inside the backward: the whole steps' difference (exposed nocomm) holds them.")
    print(flush=True)


if __name__ == "__main__":
    main()
