#!/usr/bin/env bash
# Set up (first time: .venv as for scripts/run.sh) and run the test suite. Arguments go to pytest.
#   scripts/test.sh                 # everything, including the torchrun tests and the regression gate
#   scripts/test.sh --quick         # only the tests that launch no torchrun (-m "not slow")
#   scripts/test.sh -m membench     # only the memory regression gate
# Tests run on MEMBENCH_TEST_WORKERS pytest-xdist workers (default 2; `-n 0` after the script runs them
# in this process), one test file per worker at a time (--dist loadfile): a file's tests share its
# fixtures' runs, and the regression entries never measure concurrently with each other.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo_root/scripts/install.sh"
cd "$repo_root"
args=(-n "${MEMBENCH_TEST_WORKERS:-2}" --dist loadfile)
for arg in "$@"; do
  if [[ "$arg" == "--quick" ]]; then args+=(-m "not slow"); else args+=("$arg"); fi
done
exec "${MEMBENCH_VENV:-$repo_root/.venv}/bin/python" -m pytest ${args[@]+"${args[@]}"}
