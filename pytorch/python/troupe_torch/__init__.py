"""troupe as a torch.distributed backend.

    import troupe_torch                      # registers the backend "troupe"
    import torch.distributed as dist
    dist.init_process_group("troupe")        # env:// (torchrun), or store=..., init_method=...

Everything built on ProcessGroup then runs on troupe: the collectives,
point to point, object collectives, DistributedDataParallel and its comm
hooks, torch.distributed.nn.functional. One troupe world per process serves
the default group and every group made by new_group; errors raise
RuntimeError with troupe's message (which names the call, the ranks and the
cause).
"""

import atexit as _atexit

import torch.distributed as _dist

from ._C import ProcessGroupTroupe, _create_process_group, _wait_for_completions

__all__ = ["ProcessGroupTroupe", "BACKEND"]

#: The name to give init_process_group / new_group.
BACKEND = "troupe"

if BACKEND.upper() not in _dist.Backend._plugins:
    _dist.Backend.register_backend(BACKEND, _create_process_group, extended_api=True)

# Futures complete on the bridge's own threads; let them finish before the
# interpreter finalizes (a thread that needs the GIL then is ended).
_atexit.register(_wait_for_completions, 10.0)
