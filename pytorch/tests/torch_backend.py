"""The backend "troupe" as torch.distributed users start it: every store and
init method (env:// from torchrun or a launcher, file://, tcp://, store=
with TCPStore, FileStore, PrefixStore and, in one process, HashStore), init
after destroy in the same process, troupe groups under a gloo default group,
ProcessGroupTroupe made directly from a store, and torch.multiprocessing
spawn (`torch_backend.py --spawn N`). Nothing here uses gloo's worker
threads, so the processes end through the interpreter's normal exit (which
must not hang or crash in troupe's shutdown).
"""

import os
import shutil
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import troupe_torch

torch.set_num_threads(1)


def check_group(rank, n, label, group=None):
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t, group=group)
    size = dist.get_world_size(group)
    members = dist.get_process_group_ranks(group) if group is not None else list(range(n))
    expect = float(sum(r + 1 for r in members))
    assert t.tolist() == [expect] * 3, f"{label}: all_reduce gave {t.tolist()}, expected {expect}"
    assert dist.get_backend(group) == "troupe", f"{label}: backend {dist.get_backend(group)}"
    objs = [None] * size
    dist.all_gather_object(objs, rank, group=group)
    assert objs == members, f"{label}: all_gather_object {objs}"
    if rank == 0 or (group is not None and rank == members[0]):
        print(f"ok {label}", flush=True)


def phases(rank, n, tmp):
    # 1. env:// (the launcher's or torchrun's variables).
    dist.init_process_group("troupe", timeout=timedelta(seconds=60))
    check_group(rank, n, "env://")
    sub = dist.new_group([r for r in range(n) if r % 2 == 0])
    if rank % 2 == 0:
        check_group(rank, n, "new_group of the even ranks", sub)
    dist.destroy_process_group()

    # 2. file:// (a FileStore the init method makes).
    dist.init_process_group("troupe", init_method=f"file://{tmp}/init", rank=rank, world_size=n)
    check_group(rank, n, "file:// after destroy_process_group")
    dist.destroy_process_group()

    # 3. store=FileStore and store=PrefixStore(TCPStore).
    dist.init_process_group("troupe", store=dist.FileStore(f"{tmp}/store", n), rank=rank,
                            world_size=n)
    check_group(rank, n, "store=FileStore")
    dist.destroy_process_group()
    port = int(os.environ["MASTER_PORT"])
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        tcp = dist.TCPStore("127.0.0.1", port, n, False, timedelta(seconds=60))  # torchrun's
    else:
        tcp = dist.TCPStore("127.0.0.1", int(os.environ["TROUPE_TEST_PORT"]), n, rank == 0,
                            timedelta(seconds=60))
    dist.init_process_group("troupe", store=dist.PrefixStore("phase4", tcp), rank=rank,
                            world_size=n)
    check_group(rank, n, "store=PrefixStore(TCPStore)")

    # 4. ProcessGroupTroupe made directly, beside the default group.
    pg = troupe_torch.ProcessGroupTroupe(dist.PrefixStore("direct", tcp), rank, n,
                                         timedelta(seconds=60))
    t = torch.ones(2) * rank
    pg.allreduce([t]).wait()
    assert t.tolist() == [sum(range(n))] * 2, t
    assert pg.size() == n and pg.rank() == rank and pg.name() == "troupe"
    dist.destroy_process_group()
    del pg

    # 5. A gloo default group with troupe groups made by new_group (a world per group).
    dist.init_process_group("gloo", store=dist.PrefixStore("phase5", tcp), rank=rank,
                            world_size=n)
    everyone = dist.new_group(backend="troupe")
    check_group(rank, n, "troupe group under a gloo default group", everyone)
    pair = dist.new_group([0, n - 1], backend="troupe")
    if rank in (0, n - 1):
        check_group(rank, n, "troupe pair under a gloo default group", pair)
    dist.barrier()
    dist.destroy_process_group()

    # 6. HashStore: one rank per process, each its own world.
    dist.init_process_group("troupe", store=dist.HashStore(), rank=0, world_size=1)
    t = torch.tensor([5.0])
    dist.all_reduce(t)
    assert t.item() == 5.0
    dist.destroy_process_group()
    if rank == 0:
        print("ok store=HashStore (one rank)", flush=True)


def spawned(rank, n, init):
    dist.init_process_group("troupe", init_method=init, rank=rank, world_size=n)
    check_group(rank, n, f"torch.multiprocessing.spawn with {init.split(':')[0]}://")
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--spawn":
        n = int(sys.argv[2])
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(spawned, args=(n, f"file://{tmp}/spawn"), nprocs=n, join=True)
            port = int(os.environ["TROUPE_TEST_PORT"])
            mp.spawn(spawned, args=(n, f"tcp://127.0.0.1:{port}"), nprocs=n, join=True)
        sys.exit(0)
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # Every rank needs the same directory: one per job, named by its port.
    tmp = os.path.join(tempfile.gettempdir(), f"troupe_torch_backend_{os.environ['MASTER_PORT']}")
    os.makedirs(tmp, exist_ok=True)
    phases(rank, n, tmp)
    if rank == 0:  # every rank left the file stores behind in phase 5's collectives
        shutil.rmtree(tmp, ignore_errors=True)
