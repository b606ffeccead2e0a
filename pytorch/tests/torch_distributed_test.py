"""Runs PyTorch's own distributed test file on troupe.

    torch_distributed_test.py --mode MODE -n N [--only NAME ...] [--list]

PyTorch ships its distributed tests with the package
(torch/testing/_internal/distributed/distributed_test.py). Each test forks N
processes that call init_process_group and run the test; the file gates most
of its tests on the backend's name. MODE says how they meet troupe:

  troupe   BACKEND=troupe: the tests torch runs for a plugin backend.
  gloo     BACKEND=gloo, every group torch makes for gloo made on troupe
           instead (the default group, new_group, monitored_barrier's):
           the tests torch writes for gloo, run on troupe.
  gloo-ref BACKEND=gloo on gloo itself: the reference on this machine.

A test fails the run unless it passes, or torch skips it, or it is listed in
EXPECTED below (with the reason it cannot pass here: the same on gloo).
Exit codes: 0 as expected, 1 an unexpected failure (or an expected failure
that passed), 77 skipped (this Python has no torch).
"""

import argparse
import gc
import os
import sys
import tempfile
import time
import types
import unittest

try:
    import torch  # noqa: F401
except ImportError:
    print("torch_distributed_test: this Python has no torch; skipped")
    sys.exit(77)

# Tests that cannot pass in a mode, with the reason (gloo passes every test
# of the file that it runs on this machine, with 2, 3 and 4 processes).
EXPECTED = {
    "gloo": {
        # DDP's logger reads the backend's own name (troupe), while torch calls
        # the group gloo in this mode; in mode troupe the test runs and passes.
        "test_ddp_logging_data_cpu": "DDP logs the backend's name, troupe, where the test "
                                     "expects the name torch gave the group, gloo",
    },
}


def install_expecttest_stand_in():
    """torch's common_utils imports expecttest (not packaged in Debian 12);
    the distributed tests use only its TestCase base and ACCEPT flag."""
    try:
        import expecttest  # noqa: F401
        return
    except ImportError:
        pass
    m = types.ModuleType("expecttest")
    m.ACCEPT = False

    class TestCase(unittest.TestCase):
        def assertExpectedInline(self, actual, expect, skip=0):  # noqa: N802
            self.assertEqual(actual, expect)

    m.TestCase = TestCase
    sys.modules["expecttest"] = m


def keep_ddp_without_replicated_tensor():
    """torch's test harness turns on DDP's ReplicatedTensor prototype in every
    process; its module (torch.distributed._shard) does not import under
    Python 3.11 with torch 1.13 ("mutable default ... TensorProperties"), which
    fails every DDP test on gloo too. Keep DDP as users run it."""
    from torch.nn.parallel import _replicated_tensor_ddp_utils as rt

    rt._set_ddp_with_replicated_tensor = lambda value: None


def skip_gpu_tests_in_the_runner():
    """Tests that need GPUs find out in each of their forked processes, after
    it made its group (torch's skip_if_lt_x_gpu and skip_if_no_gpu exit with a
    skip code there): on a torch built without CUDA the answer is known here.
    The same tests skip with the same reasons, without forking N processes
    each to learn it (84 tests of the file)."""
    if torch.version.cuda is not None:
        return  # GPUs may be there: each test's processes look, as torch does
    from torch.testing._internal import common_distributed as cd

    def skip_if_lt_x_gpu(x):
        return unittest.skip(cd.TEST_SKIPS[f"multi-gpu-{x}"].message)

    cd.skip_if_lt_x_gpu = skip_if_lt_x_gpu
    cd.skip_if_no_gpu = unittest.skip(cd.TEST_SKIPS["no_cuda"].message)


def route_gloo_to_troupe():
    """Every group torch would make on gloo is made on troupe, while torch
    still calls it gloo (so the gloo-gated tests and monitored_barrier run)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    import troupe_torch

    helper = c10d._new_process_group_helper

    def new_group_helper(group_size, group_rank, global_ranks_in_group, backend, store,
                         pg_options=None, group_name=None, timeout=c10d.default_pg_timeout):
        if dist.Backend(backend) != dist.Backend.GLOO:
            return helper(group_size, group_rank, global_ranks_in_group, backend, store,
                          pg_options, group_name, timeout)
        pg = helper(group_size, group_rank, global_ranks_in_group, troupe_torch.BACKEND, store,
                    pg_options, group_name, timeout)
        if pg is not c10d.GroupMember.NON_GROUP_MEMBER:
            c10d._pg_map[pg] = (dist.Backend.GLOO, store)
        return pg

    c10d._new_process_group_helper = new_group_helper


def poll_sooner(dt):
    """torch's harness polls every 0.1 s: for its file barrier between a
    test's processes (at least two per test) and for their exit; most tests
    here take less than that. Poll every 5 ms instead (the same files, lock
    and timeouts): a run takes a third to a quarter of the time."""
    import types

    from torch.testing._internal import common_distributed as cd

    def sync(cls, wait_for=None, timeout=10):
        import torch.distributed as dist

        wait_for = dist.get_world_size() if wait_for is None else wait_for
        cls.barrier_id += 1
        barrier_dir = os.path.join(os.environ["TEMP_DIR"], "barrier")
        with dt._lock():
            with open(os.path.join(barrier_dir, str(os.getpid())), "w") as f:
                f.write(str(cls.barrier_id))
        start = time.time()
        while True:
            with dt._lock():
                arrived = 0
                for name in os.listdir(barrier_dir):
                    with open(os.path.join(barrier_dir, name)) as f:
                        arrived += int(f.read()) >= cls.barrier_id
            if arrived == wait_for:
                return
            if time.time() - start > timeout:
                raise RuntimeError("barrier timeout")
            time.sleep(0.005)

    dt.Barrier.sync = classmethod(sync)
    # _join_processes is the one sleeper of common_distributed.
    clock = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("_")})
    clock.sleep = lambda seconds: time.sleep(min(seconds, 0.005))
    cd.time = clock


def read_troupe_events_as_gloo(dt):
    """troupe's calls show in a profile as "troupe:all_reduce", ...; the
    gloo tests look for "gloo:all_reduce": give them troupe's events under
    the name they ask for."""
    import copy

    find = dt.get_profiling_event

    def get_profiling_event(postfix, profiler):
        if not postfix.startswith("gloo:"):
            return find(postfix, profiler)
        events = []
        for e in find("troupe:" + postfix[len("gloo:"):], profiler):
            e = copy.copy(e)
            e.name = postfix
            events.append(e)
        return events

    dt.get_profiling_event = get_profiling_event


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["troupe", "gloo", "gloo-ref"], required=True)
    ap.add_argument("-n", type=int, required=True, help="processes per test")
    ap.add_argument("--only", action="append", default=[], help="run only these tests")
    ap.add_argument("--list", action="store_true", help="list the tests and exit")
    ap.add_argument("-v", action="store_true", help="one line per test")
    args = ap.parse_args()
    sys.argv = sys.argv[:1]  # torch's common_utils parses the command line too

    tmp = tempfile.mkdtemp(prefix="troupe-dist-test-")
    os.environ["BACKEND"] = "troupe" if args.mode == "troupe" else "gloo"
    os.environ["WORLD_SIZE"] = str(args.n)
    os.environ["TEMP_DIR"] = tmp
    os.environ["INIT_METHOD"] = f"file://{tmp}/shared_init_file"
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    install_expecttest_stand_in()
    keep_ddp_without_replicated_tensor()
    skip_gpu_tests_in_the_runner()
    if args.mode != "gloo-ref":
        import troupe_torch  # noqa: F401  (registers "troupe")
    if args.mode == "gloo":
        route_gloo_to_troupe()

    import logging

    from torch.testing._internal.common_distributed import DistTestCases
    from torch.testing._internal.distributed import distributed_test as dt

    poll_sooner(dt)
    if args.mode == "gloo":
        read_troupe_events_as_gloo(dt)
    if args.mode == "troupe":
        # What troupe implements, in the sets torch keeps for plugin backends.
        for feature in ("plugin", "ddp", "subgroup"):
            DistTestCases.backend_feature[feature].add("troupe")

    class TestDistBackendWithFork(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._start_processes(torch.multiprocessing.get_context("fork").Process)

        @classmethod
        def _run(cls, rank, test_name, file_name, pipe):
            """A test's process ends with its exit code as torch's harness
            gives it, without finalizing the interpreter it forked from (that
            touches every object, copying the parent's pages: most of a
            run's system time)."""
            code = 0
            try:
                super()._run(rank, test_name, file_name, pipe)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    logging.getLogger().setLevel(logging.WARNING)  # torch's harness logs every start at INFO

    loader = unittest.TestLoader()
    names = loader.getTestCaseNames(TestDistBackendWithFork)
    if args.only:
        names = [n for n in names if n in args.only]
    if args.list:
        print("\n".join(names))
        return 0
    suite = unittest.TestSuite(TestDistBackendWithFork(n) for n in names)
    # What the runner made so far is never collected: the forked test
    # processes then copy fewer of its pages.
    gc.freeze()

    class TimedResult(unittest.TextTestResult):
        """Keeps each test's duration (the slowest are printed at the end)."""
        durations = {}

        def startTest(self, test):  # noqa: N802
            self._started = time.monotonic()
            super().startTest(test)

        def stopTest(self, test):  # noqa: N802
            super().stopTest(test)
            self.durations[test.id().split(".")[-1]] = time.monotonic() - self._started

    start = time.monotonic()
    result = unittest.TextTestRunner(verbosity=2 if args.v else 1, stream=sys.stdout,
                                     resultclass=TimedResult).run(suite)
    took = time.monotonic() - start

    expected = EXPECTED.get(args.mode, {})
    failed = {t.id().split(".")[-1] for t, _ in result.failures + result.errors}
    skipped = {t.id().split(".")[-1] for t, _ in result.skipped}
    passed_expected = [n for n in expected if n in names and n not in failed | skipped]
    unexpected = failed - set(expected)
    passed = result.testsRun - len(skipped) - len(failed)
    print(f"\ntorch_distributed_test --mode {args.mode} -n {args.n}: {result.testsRun} tests, "
          f"{passed} passed, {len(skipped)} skipped, {len(failed)} failed "
          f"({len(failed) - len(unexpected)} expected), {took:.0f} s")
    slowest = sorted(TimedResult.durations.items(), key=lambda kv: -kv[1])[:5]
    print("  slowest: " + ", ".join(f"{n} {d:.1f} s" for n, d in slowest))
    for n in sorted(failed):
        print(f"  {'expected' if n in expected else 'FAILED  '} {n}"
              + (f": {expected[n]}" if n in expected else ""))
    for n in passed_expected:
        print(f"  PASSED, but listed as failing: {n} (take it off EXPECTED)")
    return 1 if unexpected or passed_expected else 0


if __name__ == "__main__":
    sys.exit(main())
