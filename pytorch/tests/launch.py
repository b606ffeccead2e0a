"""Starts the processes of one torch test: launch.py -n N [options] script [args...]

  --mode env       N processes with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
                   MASTER_PORT set (init_method env://), output prefixed [r]
  --mode torchrun  torch.distributed.run --nproc_per_node N (with the flags
                   Debian 12's torchrun needs on Python 3.11: --redirects 1 --tee 1)
  --mode spawn     one process running `script --spawn N` (the script calls
                   torch.multiprocessing.spawn itself)
  --expect-exit R:C  rank R is expected to end with exit code C (a test that
                   kills a rank)
  --timeout S      the whole job's limit (default 240 s)

The processes also get TROUPE_TEST_PORT, a second free port (for a test
that serves a store of its own). Exits 0 when every process did as expected, 77 (skipped) when this Python
has no torch, otherwise with the first unexpected exit code.
"""

import argparse
import importlib.util
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time


def free_port():
    """A port free now, below the kernel's range for outgoing connections:
    the store is served seconds later (once torch has loaded), and a port
    from that range may meanwhile become the local end of another test's
    connection (a rank then connected to it and was reset)."""
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    rng = random.Random()
    for _ in range(100):
        port = rng.randrange(10000, max(low, 10001))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pump(stream, prefix):
    for line in iter(stream.readline, b""):
        sys.stdout.write(prefix + line.decode(errors="replace"))
        sys.stdout.flush()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-n", type=int, required=True)
    p.add_argument("--mode", choices=["env", "torchrun", "spawn"], default="env")
    p.add_argument("--expect-exit", action="append", default=[])
    p.add_argument("--timeout", type=float, default=240)
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args()

    # Found, not imported: importing torch costs about a second of CPU, and
    # the ranks import it themselves (a broken torch fails them, loudly).
    if importlib.util.find_spec("torch") is None:
        print(f"launch.py: SKIP, {sys.executable} has no torch")
        return 77

    expected = {}
    for e in a.expect_exit:
        r, c = e.split(":")
        expected[int(r)] = int(c)

    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["MASTER_ADDR"] = "127.0.0.1"
    env["MASTER_PORT"] = str(free_port())
    env["TROUPE_TEST_PORT"] = str(free_port())  # a second port for tests that serve a store
    py = sys.executable
    if a.mode == "torchrun":
        cmds = [[py, "-m", "torch.distributed.run", "--nproc_per_node", str(a.n),
                 "--master_addr", "127.0.0.1", "--master_port", env["MASTER_PORT"],
                 "--redirects", "1", "--tee", "1", a.script] + a.args]
        envs = [env]
    elif a.mode == "spawn":
        cmds = [[py, a.script, "--spawn", str(a.n)] + a.args]
        envs = [env]
    else:
        cmds, envs = [], []
        for r in range(a.n):
            e = dict(env, RANK=str(r), WORLD_SIZE=str(a.n), LOCAL_RANK=str(r),
                     LOCAL_WORLD_SIZE=str(a.n))
            cmds.append([py, a.script] + a.args)
            envs.append(e)

    procs, pumps = [], []
    for i, (cmd, e) in enumerate(zip(cmds, envs)):
        pr = subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              start_new_session=True)
        prefix = f"[{i}] " if len(cmds) > 1 else ""
        t = threading.Thread(target=pump, args=(pr.stdout, prefix), daemon=True)
        t.start()
        procs.append(pr)
        pumps.append(t)

    deadline = time.monotonic() + a.timeout
    failure = None
    codes = [None] * len(procs)
    while any(c is None for c in codes):
        for i, pr in enumerate(procs):
            if codes[i] is None and pr.poll() is not None:
                codes[i] = pr.returncode
                if codes[i] != expected.get(i, 0) and failure is None:
                    failure = (i, codes[i])
        if failure is not None:
            # Give the others a moment to report their own view, then stop them.
            grace = time.monotonic() + 10
            while time.monotonic() < grace and any(pr.poll() is None for pr in procs):
                time.sleep(0.05)
            break
        if time.monotonic() > deadline:
            print(f"launch.py: timed out after {a.timeout} s", flush=True)
            failure = (-1, 124)
            break
        time.sleep(0.02)
    for pr in procs:
        if pr.poll() is None:
            os.killpg(pr.pid, signal.SIGKILL)
    for pr in procs:
        pr.wait()
    for t in pumps:
        t.join(timeout=5)
    if failure is not None:
        i, c = failure
        if i >= 0:
            print(f"launch.py: process {i} exited with {c} (expected {expected.get(i, 0)})",
                  flush=True)
        return c if c not in (0, 77) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
