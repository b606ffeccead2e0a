"""What the torch tests share: the two process groups compared (troupe's
default group and a gloo group over the same ranks), inputs every rank can
compute for every rank, comparisons, and a small case runner.
"""

import os
import sys
import traceback
import warnings

import torch
import torch.distributed as dist

import troupe_torch  # noqa: F401  (registers the backend "troupe")

torch.set_num_threads(1)
# torch 1.13 warns about its private and soon deprecated calls the tests use on purpose.
warnings.filterwarnings("ignore", category=UserWarning, module="torch.distributed")


#: Set by torch_suites.py while it runs several suites in one process: init()
#: then hands every suite the same groups and finish() leaves them open.
several = False
_started = None


def init(gloo=True):
    """Default group on troupe (env://); returns (rank, size, gloo_group)."""
    global _started
    if _started is None or not several:
        dist.init_process_group("troupe")
        g = dist.new_group(backend="gloo") if gloo or several else None
        _started = (dist.get_rank(), dist.get_world_size(), g)
    return _started


FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
COMPLEX = [torch.complex64, torch.complex128]
ALL_DTYPES = [torch.bool] + INTS + FLOATS + COMPLEX
#: What gloo (PyTorch 1.13) takes; the rest is compared with a reference.
GLOO_DTYPES = {torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.float32,
               torch.float64}


def data(rank, shape, dtype, salt=0):
    """The input of `rank` (any rank can compute any rank's)."""
    g = torch.Generator().manual_seed(7919 * salt + 101 * rank + 13)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype in INTS:
        lo = 0 if dtype == torch.uint8 else -6
        return torch.randint(lo, 7, shape, generator=g).to(dtype)
    if dtype in COMPLEX:
        return torch.randn(shape, generator=g, dtype=dtype)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(dtype)


def assert_same(actual, expected, what, exact=True):
    """Equal bit for bit (exact) or within torch's default tolerance of the dtype."""
    if isinstance(actual, (list, tuple)):
        assert len(actual) == len(expected), f"{what}: {len(actual)} tensors, expected {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{what}[{i}]", exact)
        return
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, expected {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape}, expected {expected.shape}"
    if exact:
        if not torch.equal(actual, expected):
            raise AssertionError(f"{what}: differs\n actual   {actual}\n expected {expected}")
    else:
        # Half precision: gloo rounds every partial result, troupe once (its
        # float32 result rounded), so they may differ by a few units in the last place.
        tol = {torch.float16: dict(rtol=4e-3, atol=1e-5), torch.bfloat16: dict(rtol=3.2e-2, atol=1e-5)}
        torch.testing.assert_close(actual, expected, msg=lambda m: f"{what}: {m}",
                                   **tol.get(actual.dtype, {}))


class Cases:
    """Test cases run in order on every rank; a failure ends the process with 1."""

    def __init__(self):
        self.cases = []

    def __call__(self, fn):
        self.cases.append(fn)
        return fn

    def run(self, sync_group=None):
        only = os.environ.get("TROUPE_TEST_CASE")
        rank = dist.get_rank() if dist.is_initialized() else 0
        for fn in self.cases:
            if only and only not in fn.__name__:
                continue
            if sync_group is not None:
                dist.barrier(group=sync_group)
            try:
                fn()
            except Exception:
                print(f"FAILED {fn.__name__} on rank {rank}:", flush=True)
                traceback.print_exc()
                sys.stdout.flush()
                os._exit(1)
            if rank == 0:
                print(f"ok {fn.__name__}", flush=True)


def finish(gloo_group):
    """Ends a test process: a last barrier, then exit without the interpreter's
    finalization. (torch 1.13's gloo worker threads may still free a tensor
    that has a Python object while Python 3.11 finalizes, which aborts the
    process in PyEval_AcquireThread; troupe's clean exit is tested by the
    suites without gloo.)"""
    dist.barrier(group=gloo_group)
    if several:
        return  # the next suite of torch_suites.py runs in this process
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
