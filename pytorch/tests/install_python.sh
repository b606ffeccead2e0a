#!/usr/bin/env bash
# torch_install_python: installs the build into a temporary prefix and runs
# troupe_torch from there, without the build tree on any path: one rank over
# a HashStore, then two processes over env:// with DistributedDataParallel.
#   install_python.sh <build dir> <python> <package dir relative to the prefix>
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$1" && pwd)
python=$2
pkgdir=$3
if ! "$python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" 2>/dev/null; then
  echo "SKIP: $python has no torch"; exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/troupe-torch-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cd "$tmp"
export PYTHONPATH="$tmp/prefix/$pkgdir" PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
"$python" - <<'PY'
import os, troupe_torch, torch, torch.distributed as dist
assert troupe_torch.__file__.startswith(os.environ["PYTHONPATH"]), troupe_torch.__file__
dist.init_process_group("troupe", store=dist.HashStore(), rank=0, world_size=1)
t = torch.arange(4.0)
dist.all_reduce(t)
assert t.tolist() == [0.0, 1.0, 2.0, 3.0], t
dist.destroy_process_group()
print("installed troupe_torch: one rank ok")
PY
cat > ddp.py <<'PY'
import troupe_torch, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("troupe")
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 2))
torch.manual_seed(1 + dist.get_rank())
model(torch.randn(8, 4)).sum().backward()
g = model.module.weight.grad.clone()
gs = [torch.empty_like(g) for _ in range(dist.get_world_size())]
dist.all_gather(gs, g)
assert all(torch.equal(x, g) for x in gs), "ranks hold different gradients"
print(f"installed troupe_torch: DDP on rank {dist.get_rank()} ok", flush=True)
dist.destroy_process_group()
PY
"$python" "$here/launch.py" -n 2 ddp.py
