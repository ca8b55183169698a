#!/usr/bin/env bash
# Set up (first time: .venv as for scripts/run.sh) and run the test suite. Arguments go to pytest,
# e.g.  scripts/test.sh -m "not slow"   (skip the torchrun end-to-end tests)
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo_root/scripts/install.sh"
cd "$repo_root"
exec "${MEMBENCH_VENV:-$repo_root/.venv}/bin/python" -m pytest "$@"
