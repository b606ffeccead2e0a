"""torch_ddp_reference — what torch 1.13's own DistributedDataParallel does, on
gloo, in the scenarios test_torch_ddp checks troupe_torch's LibTorch DDP
against: the logging data (_get_ddp_logging_data), training a checkpointed
model (torch.utils.checkpoint, reentrant) with and without static_graph, and
uneven inputs under Join. Every scenario runs in its own forked processes
(2 to 4) with the same models, initial values and inputs as the C++ test
(seeded torch.Generator draws, which LibTorch reproduces exactly).

    /usr/bin/python3 pytorch/tests/torch_ddp_reference.py --out FILE
    /usr/bin/python3 pytorch/tests/torch_ddp_reference.py --check FILE

--out writes the reference (pytorch/tests/data/torch_ddp_reference.txt is
such a file, read by the C++ test); --check runs torch again and compares
with FILE (strings and integers exactly, tensors within 1e-5), exits 1 when
they differ and 77 when this interpreter has no torch.

The format, one entry per line: `s KEY VALUE...` (a string: the rest of the
line), `i KEY INT`, `t KEY NDIM DIMS... VALUES...` (float32 tensors, 9
significant digits), `e KEY MESSAGE` (an error a scenario raised). Values that
depend on the run (times, environment variables) are written as `present`.
"""

import argparse
import os
import socket
import sys
import tempfile

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.checkpoint import checkpoint
except ImportError as e:  # the C++ test needs none of this
    print(f"torch_ddp_reference: SKIP, {sys.executable} has no torch ({e})")
    sys.exit(77)

RUN_DEPENDENT = {"master_addr", "master_port", "torch_distributed_debug", "cuda_visible_devices",
                 "forward_compute_time", "backward_compute_time", "backward_comm_time",
                 "backward_compute_comm_overlap_time", "avg_forward_compute_time",
                 "avg_backward_compute_time", "avg_backward_comm_time",
                 "avg_backward_compute_comm_overlap_time", "forward_compute_time_start",
                 "backward_compute_time_start", "backward_comm_time_start",
                 "backward_compute_time_end", "backward_comm_time_end"}


def gen(seed):
    return torch.Generator().manual_seed(seed)


def init_params(module, seed, scale=0.1):
    g = gen(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)


def sgd(module, lr):
    with torch.no_grad():
        for p in module.parameters():
            if p.grad is not None:
                p -= lr * p.grad


def zero_grads(module):
    for p in module.parameters():
        if p.grad is not None:
            p.grad.zero_()


# -- models (the C++ test defines the same) --------------------------------------------------

class LogNet(nn.Module):
    def __init__(self, unused=False):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(),
                                 nn.Linear(512, 8))
        if unused:
            self.unused = nn.Linear(8, 8)

    def forward(self, x):
        return self.net(x)


class CheckpointOnce(nn.Module):
    def __init__(self, twice=False):
        super().__init__()
        self.l1 = nn.Linear(20, 20)
        self.l2 = nn.Linear(20, 20)
        self.twice = twice

    def forward(self, x):
        x = self.l1(x)
        x = checkpoint(self.l2, x, use_reentrant=True)
        if self.twice:
            x = checkpoint(self.l2, x, use_reentrant=True)
        return x


class JoinNet(nn.Module):
    def __init__(self, extra=False):
        super().__init__()
        self.l1 = nn.Linear(4, 8)
        self.bn = nn.BatchNorm1d(8)
        self.l2 = nn.Linear(8, 2)
        if extra:
            self.extra = nn.Linear(2, 2)
        self.use_extra = False

    def forward(self, x):
        x = self.l2(F.relu(self.bn(self.l1(x))))
        return self.extra(x) if self.use_extra else x


# -- scenarios: run on every rank, return {key: value} from rank 0 ---------------------------

LOGGING = {  # name: (DDP options, model with an unused layer, steps: S synchronised, N no_sync)
    "default": ({}, False, "SSS"),
    "unused_views": ({"find_unused_parameters": True, "gradient_as_bucket_view": True}, True,
                     "SSS"),
    "static": ({"static_graph": True}, False, "SSSS"),
    "no_sync": ({}, False, "SSNS"),
}


def logging_scenario(rank, n, name):
    opts, unused, steps = LOGGING[name]
    model = LogNet(unused)
    init_params(model, 11)
    ddp = DDP(model, **opts)
    out = {}

    def snap(when):
        d = ddp._get_ddp_logging_data()
        for k, v in d.items():
            if k.startswith("gloo_"):
                continue
            tag = "i" if isinstance(v, int) else "s"
            value = "present" if k in RUN_DEPENDENT else v
            out[f"logging.{name}.{when}.rank{rank}.{k}"] = (tag, value)

    snap("construction")
    for k, s in enumerate(steps):
        g = gen(1000 * rank + k)
        x, y = torch.randn(4, 64, generator=g), torch.randn(4, 8, generator=g)
        if s == "N":
            with ddp.no_sync():
                F.mse_loss(ddp(x), y).backward()
        else:
            F.mse_loss(ddp(x), y).backward()
            sgd(model, 0.01)
        snap(f"step{k + 1}")
    return out


CHECKPOINT = {  # name: (twice, DDP options); those that torch refuses raise
    "once": (False, {}),
    "once_static_views": (False, {"static_graph": True, "gradient_as_bucket_view": True}),
    "twice_static": (True, {"static_graph": True}),
    "once_unused_static": (False, {"static_graph": True, "find_unused_parameters": True}),
    "twice": (True, {}),
    "once_unused": (False, {"find_unused_parameters": True}),
}


def checkpoint_scenario(rank, n, name):
    twice, opts = CHECKPOINT[name]
    model = CheckpointOnce(twice)
    init_params(model, 31415)
    ddp = DDP(model, bucket_cap_mb=1, **opts)
    g = gen(2024)
    per = 16
    inp = torch.rand(per * n, 20, generator=g, requires_grad=True)
    target = torch.randn(per * n, 20, generator=g)
    x, y = inp[rank * per:(rank + 1) * per], target[rank * per:(rank + 1) * per]
    out = {}
    try:
        for _ in range(5):
            zero_grads(model)
            F.mse_loss(ddp(x), y).backward()
            sgd(model, 0.1)
    except RuntimeError as e:
        first = str(e).splitlines()[0]
        out[f"checkpoint.{name}.error"] = ("e", first)
        return out
    for k, p in model.named_parameters():
        out[f"checkpoint.{name}.{k}"] = ("t", p.detach().clone())
    return out


JOIN = {  # name: (batches per rank, divide_by_initial_world_size, find_unused_parameters,
          #        static_graph, each batch as two micro-batches, the first under no_sync)
    "n2": ([2, 4], True, False, False, False),
    "n2_divide_by_training": ([2, 4], False, False, False, False),
    "n2_static": ([2, 4], True, False, True, False),
    "n2_no_sync": ([2, 3], True, False, False, True),
    "n3": ([3, 1, 0], True, False, False, False),
    "n3_divide_by_training": ([3, 1, 0], False, False, False, False),
    "n4": ([1, 3, 2, 3], True, False, False, False),
    "n3_unused": ([2, 3, 1], True, True, False, False),
}


def join_scenario(rank, n, name):
    counts, divide, unused, static, micro = JOIN[name]
    model = JoinNet(extra=unused)
    init_params(model, 7)
    ddp = DDP(model, find_unused_parameters=unused, static_graph=static)
    with ddp.join(divide_by_initial_world_size=divide):
        for k in range(counts[rank]):
            g = gen(100 * rank + k)
            rows = 4 if micro else 3
            x, y = torch.randn(rows, 4, generator=g), torch.randn(rows, 2, generator=g)
            model.use_extra = unused and k % 2 == 1
            zero_grads(model)
            if micro:
                with ddp.no_sync():
                    F.mse_loss(ddp(x[:2]), y[:2]).backward()
                F.mse_loss(ddp(x[2:]), y[2:]).backward()
            else:
                F.mse_loss(ddp(x), y).backward()
            sgd(model, 0.1)
    out = {}
    for k, t in list(model.named_parameters()) + list(model.named_buffers()):
        ref = t.detach().clone()
        dist.broadcast(ref, 0)
        assert torch.equal(ref, t.detach()), f"join {name}: rank {rank} {k} differs from rank 0's"
        out[f"join.{name}.{k}"] = ("t", t.detach().clone().float())
    return out


def join_throw_scenario(rank, n, name):
    model = JoinNet()
    init_params(model, 7)
    ddp = DDP(model)
    out = {}
    try:
        with ddp.join(throw_on_early_termination=True):
            for k in range([1, 3][rank]):
                g = gen(100 * rank + k)
                x, y = torch.randn(3, 4, generator=g), torch.randn(3, 2, generator=g)
                F.mse_loss(ddp(x), y).backward()
    except RuntimeError as e:
        out[f"join.throw.rank{rank}.error"] = ("e", str(e).splitlines()[0])
    return out


def worker(rank, n, port, fn, name, path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=n)
    out = fn(rank, n, name)
    # Every rank's entries to rank 0 (the per-rank keys differ).
    gathered = [None] * n
    dist.all_gather_object(gathered, out)
    if rank == 0:
        merged = {}
        for o in gathered:
            merged.update(o)
        torch.save(merged, path)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(fn, name, n):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.pt")
        mp.start_processes(worker, args=(n, free_port(), fn, name, path), nprocs=n,
                           start_method="fork")
        return torch.load(path)


def collect():
    entries = {}
    for name in LOGGING:
        entries.update(run(logging_scenario, name, 2))
    for name in CHECKPOINT:
        entries.update(run(checkpoint_scenario, name, 2))
    for name, (counts, *_) in JOIN.items():
        entries.update(run(join_scenario, name, len(counts)))
    entries.update(run(join_throw_scenario, "throw", 2))
    return entries


def format_entries(entries):
    lines = [f"# torch {torch.__version__}: written by pytorch/tests/torch_ddp_reference.py"]
    for key in sorted(entries):
        tag, v = entries[key]
        if tag == "t":
            values = " ".join(f"{x:.9g}" for x in v.reshape(-1).tolist())
            lines.append(f"t {key} {v.dim()} {' '.join(str(d) for d in v.shape)} {values}")
        else:
            lines.append(f"{tag} {key} {v}")
    return "\n".join(lines) + "\n"


def parse(text):
    r = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        tag, key, rest = (line.split(" ", 2) + [""])[:3]
        if tag == "t":
            f = rest.split()
            nd = int(f[0])
            r[key] = (tag, [int(d) for d in f[1:1 + nd]], [float(x) for x in f[1 + nd:]])
        else:
            r[key] = (tag, rest)
    return r


def main():
    p = argparse.ArgumentParser()
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--out")
    g.add_argument("--check")
    a = p.parse_args()
    text = format_entries(collect())
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
        return 0
    with open(a.check) as f:
        want = parse(f.read())
    got = parse(text)
    bad = []
    for key in sorted(set(want) | set(got)):
        if key not in want or key not in got:
            bad.append(f"{key}: only in {'the run' if key in got else a.check}")
            continue
        w, o = want[key], got[key]
        if w[0] == "t":
            if w[1] != o[1] or any(abs(x - y) > 1e-5 * max(1.0, abs(x)) for x, y in zip(w[2], o[2])):
                bad.append(f"{key}: tensors differ")
        elif w != o:
            bad.append(f"{key}: {a.check} has {w[1]!r}, this run {o[1]!r}")
    for b in bad:
        print("torch_ddp_reference: " + b)
    print(f"torch_ddp_reference: {len(got)} entries, {len(bad)} differ from {a.check}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
