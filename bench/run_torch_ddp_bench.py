"""The DDP benchmark: torch's DistributedDataParallel step on the backend
"troupe" against "gloo" (bench/torch_ddp_bench.py, one process per rank,
started by pytorch/tests/launch.py) and troupe's LibTorch
distributed_data_parallel step (the program torch_ddp_bench, started by
troupe-run) against the Python step on troupe, with 2 and 4 processes; prints
the tables with the ratios of this run.

    /usr/bin/python3 bench/run_torch_ddp_bench.py --build build
        [--procs 2,4] [--rounds 7] [--passes 2] [--models large,small]
        [--transport shm|tcp] [--check-only]

Every pass runs the Python program and the C++ program once for each
process count, one after the other (their order alternates from pass to
pass); each program times every row once per round. The tables show medians
over all rounds of all passes of the slowest rank's times, and ratios of
those medians. --check-only: tiny models, one round, 2 processes by default;
the values are checked, the times mean nothing. Exits 77 (skipped) when this
interpreter has no torch.
"""

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCH = os.path.join(HERE, "..", "pytorch", "tests", "launch.py")
PY_BENCH = os.path.join(HERE, "torch_ddp_bench.py")

TARGET_STEP = 2.0  # Python DDP step, 25 M parameters, 2 processes: gloo / troupe at least
TARGET_SYNC = 4.0  # the synchronisation alone: gloo / troupe at least
TARGET_CPP = 1.0   # C++ step / Python step on troupe at most
TARGET_EXPOSED = 1.3  # Python DDP on troupe: exposed synchronisation / sync alone at most


def run(cmd, env, timeout):
    print("+ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, env=env, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"run_torch_ddp_bench: exit code {p.returncode} from {' '.join(cmd)}")


def count(params):
    return f"{params / 1e6:.1f} M" if params >= 1e6 else f"{params / 1e3:.0f} k"


def median(v):
    return statistics.median(v) if v else float("nan")


def merge(into, result):
    for name, m in result["models"].items():
        dst = into.setdefault(name, {"params": m["params"], "times_ms": {}})
        for row, v in m["times_ms"].items():
            dst["times_ms"].setdefault(row, []).extend(v)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", required=True, help="the build folder")
    p.add_argument("--procs", default=None,
                   help="process counts (default 2,4; 2 with --check-only)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--models", default="large,small")
    p.add_argument("--transport", default=None, help="troupe's TROUPE_TRANSPORT (default shm)")
    p.add_argument("--check-only", action="store_true")
    a = p.parse_args()
    # Found, not imported (a second of CPU): the benchmark's ranks import it.
    if importlib.util.find_spec("torch") is None:
        print(f"run_torch_ddp_bench: SKIP, {sys.executable} has no torch")
        return 77
    procs = [int(x) for x in (a.procs or ("2" if a.check_only else "2,4")).split(",")]
    passes = 1 if a.check_only else a.passes
    build = os.path.abspath(a.build)
    troupe_run = os.path.join(build, "apps", "troupe-run")
    cpp_bench = os.path.join(build, "bench", "torch_ddp_bench")
    pythonpath = os.path.join(build, "pytorch", "python")
    for f in (troupe_run, cpp_bench, os.path.join(pythonpath, "troupe_torch")):
        if not os.path.exists(f):
            raise SystemExit(f"run_torch_ddp_bench: {f} is missing (build troupe-run, "
                             "torch_ddp_bench and troupe_torch_module)")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    if env.get("PYTHONPATH"):
        pythonpath += os.pathsep + env["PYTHONPATH"]
    env["PYTHONPATH"] = pythonpath
    if a.transport:
        env["TROUPE_TRANSPORT"] = a.transport
    limit = 120 if a.check_only else 900
    common = ["--models", a.models] + (["--check-only"] if a.check_only else
                                       ["--rounds", str(a.rounds)])

    py_all, cpp_all = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in procs:
            py_all[n], cpp_all[n] = {}, {}
            for k in range(passes):
                py_out = os.path.join(tmp, f"py{n}_{k}.json")
                cpp_out = os.path.join(tmp, f"cpp{n}_{k}.json")
                py_cmd = [sys.executable, LAUNCH, "-n", str(n), "--timeout", str(limit), PY_BENCH,
                          "--out", py_out] + common
                cpp_cmd = [troupe_run, "-n", str(n), cpp_bench, "--out", cpp_out] + common
                for cmd in ([py_cmd, cpp_cmd] if k % 2 == 0 else [cpp_cmd, py_cmd]):
                    run(cmd, env, limit + 60)
                with open(py_out) as f:
                    merge(py_all[n], json.load(f))
                with open(cpp_out) as f:
                    merge(cpp_all[n], json.load(f))
    report(a, procs, passes, py_all, cpp_all)
    return 0


def report(a, procs, passes, py_all, cpp_all):
    transport = a.transport or "shm"
    note = " (check-only: tiny models, the times mean nothing)" if a.check_only else ""
    rounds = 1 if a.check_only else a.rounds * passes
    print(f"\n### torch DDP step: troupe against gloo{note}\n")
    print(f"One step (zero_grad, forward, backward with DDP's gradient synchronisation, SGD "
          f"step), 32 samples per rank, one torch thread per process; troupe over {transport}, "
          f"gloo over TCP loopback; median of {rounds} rounds of the slowest rank's time, ms.\n")
    print("| procs | model | params | troupe | gloo | troupe / gloo | gloo / troupe |")
    print("|---|---|---|---|---|---|---|")
    for n in procs:
        for name, m in py_all[n].items():
            t = {k: median(v) for k, v in m["times_ms"].items()}
            print(f"| {n} | {name} | {count(m['params'])} | {t['ddp troupe']:.2f} | "
                  f"{t['ddp gloo']:.2f} | {t['ddp troupe'] / t['ddp gloo']:.2f} | "
                  f"{t['ddp gloo'] / t['ddp troupe']:.2f}x |")

    print(f"\n### gradient synchronisation alone: troupe against gloo{note}\n")
    print("sync: the model's gradients flattened into DDP's buckets, each bucket's allreduce "
          "issued async, then all waited for (no DDP, no backward). exposed: the DDP step "
          "minus the same step of a model copy without DDP in the same round (the "
          "synchronisation the backward does not hide); local: that step. ms.\n")
    print("| procs | model | sync troupe | sync gloo | troupe / gloo | gloo / troupe | local | "
          "exposed troupe | exposed gloo |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in procs:
        for name, m in py_all[n].items():
            t = {k: median(v) for k, v in m["times_ms"].items()}
            print(f"| {n} | {name} | {t['sync troupe']:.2f} | {t['sync gloo']:.2f} | "
                  f"{t['sync troupe'] / t['sync gloo']:.2f} | "
                  f"{t['sync gloo'] / t['sync troupe']:.2f}x | "
                  f"{t['local']:.2f} | {t['exposed troupe']:.2f} | {t['exposed gloo']:.2f} |")

    print(f"\n### where troupe's exposed synchronisation goes{note}\n")
    print("Measured at the step's tail: from the last gradient the backward computed to the "
          "end of the backward, on the rank whose backward ended last: the synchronisation "
          "nothing hid (the difference of two whole steps drowns in the computation's "
          "spread). default: torch's reducer as it comes (it copies every gradient into the "
          "buckets, dividing, and the results back out); view: gradient_as_bucket_view=True "
          "with troupe_torch.hooks.allreduce_avg_hook (no copies; the division inside the "
          "allreduce); nocomm: the same DDP with a hook that communicates nothing. exposed: "
          "the tail minus the local step's tail. The default's copies into the buckets run "
          "inside the backward, before the tail: exposed nocomm (whole steps) holds them. "
          "ms.\n")
    print("| procs | model | DDP | tail | tail nocomm | exposed | sync troupe | exposed / sync |")
    print("|---|---|---|---|---|---|---|---|")
    for n in procs:
        for name, m in py_all[n].items():
            t = {k: median(v) for k, v in m["times_ms"].items()}
            for label, key, floor in (("default", "troupe", "nocomm"),
                                      ("view", "view", "nocomm view")):
                exposed = t[f"tail {key}"] - t["tail local"]
                print(f"| {n} | {name} | {label} | {t[f'tail {key}']:.2f} | "
                      f"{t[f'tail {floor}']:.2f} | {exposed:.2f} | {t['sync troupe']:.2f} | "
                      f"{exposed / t['sync troupe']:.2f} |")

    print(f"\n### DDP step on troupe: LibTorch (C++) against torch (Python){note}\n")
    print("C++: troupe_torch::distributed_data_parallel under troupe-run; Python: torch's "
          "DistributedDataParallel on the backend \"troupe\"; the same models, samples and "
          "optimizer; ratios of the medians, ms.\n")
    print("| procs | model | C++ step | Python step | C++ / Python | C++ local | Python local | "
          "C++ exposed | Python exposed | C++ exposed comm | Python exposed comm |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in procs:
        for name, m in cpp_all[n].items():
            c = {k: median(v) for k, v in m["times_ms"].items()}
            t = {k: median(v) for k, v in py_all[n][name]["times_ms"].items()}
            print(f"| {n} | {name} | {c['ddp troupe']:.2f} | {t['ddp troupe']:.2f} | "
                  f"{c['ddp troupe'] / t['ddp troupe']:.2f} | {c['local']:.2f} | "
                  f"{t['local']:.2f} | "
                  f"{c['exposed troupe']:.2f} | {t['exposed troupe']:.2f} | "
                  f"{c['exposed comm']:.2f} | {t['exposed comm']:.2f} |")

    if a.check_only or "large" not in a.models.split(","):
        print(flush=True)
        return
    print("\nTargets (large model):")
    if 2 in procs:
        t = {k: median(v) for k, v in py_all[2]["large"]["times_ms"].items()}
        step, sync = t["ddp gloo"] / t["ddp troupe"], t["sync gloo"] / t["sync troupe"]
        print(f"  2 processes, Python DDP step on troupe >= {TARGET_STEP:.0f}x faster than on "
              f"gloo: {step:.2f}x, {'met' if step >= TARGET_STEP else 'MISSED'}")
        print(f"  2 processes, synchronisation alone >= {TARGET_SYNC:.0f}x faster: "
              f"{sync:.2f}x, {'met' if sync >= TARGET_SYNC else 'MISSED'}")
        view = (t["tail view"] - t["tail local"]) / t["sync troupe"]
        default = (t["tail troupe"] - t["tail local"]) / t["sync troupe"]
        copies = (t["tail nocomm"] - t["tail local"]) / t["sync troupe"]
        print(f"  2 processes, exposed synchronisation / bucket allreduces alone <= "
              f"{TARGET_EXPOSED:.1f} (gradient_as_bucket_view, troupe's AVG hook): {view:.2f}, "
              f"{'met' if view <= TARGET_EXPOSED else 'MISSED'} (torch's default DDP: "
              f"{default:.2f} at the tail, of which its copies back out {copies:.2f}, "
              f"plus its copies in inside the backward)")
    for n in procs:
        c = median(cpp_all[n]["large"]["times_ms"]["ddp troupe"])
        t = median(py_all[n]["large"]["times_ms"]["ddp troupe"])
        print(f"  {n} processes, C++ DDP step no slower than Python's on troupe "
              f"(C++ / Python <= {TARGET_CPP:.2f}): {c / t:.2f}, "
              f"{'met' if c / t <= TARGET_CPP else 'MISSED'}")
    print(flush=True)

if __name__ == "__main__":
    sys.exit(main())
