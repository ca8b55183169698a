#!/usr/bin/env bash
# Set up (first time: .venv with torch, the right fbgemm build and torchrec) and run a workload end to
# end. Without arguments: the tiny default workload on hardware=auto (CPU: 2 ranks under torchrun).
# Any arguments are passed to `membench run`, e.g.  scripts/run.sh workload=small sharding=column_wise
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo_root/scripts/install.sh"
cd "$repo_root"
exec "${MEMBENCH_VENV:-$repo_root/.venv}/bin/membench" run "$@"
