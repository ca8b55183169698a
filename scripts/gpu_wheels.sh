#!/usr/bin/env bash
# Fill .wheels/ (git-ignored) with the pure-Python packages membench needs beyond a bare CUDA host's torch
# (hydra-core, omegaconf, antlr4, submitit, nvidia-ml-py): cp312 wheels, a few MiB, for a host without a
# network. Run it where pip reaches the registry, then bring the repository (with .wheels/) to the GPU host
# and run scripts/gpu_check.sh there.
#
#   scripts/gpu_wheels.sh [--python-version 3.12]
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python_version="3.12"
if [[ "${1:-}" == "--python-version" ]]; then python_version="$2"; fi
dest="$repo_root/.wheels"
mkdir -p "$dest"
pip=("${PYTHON:-python3}" -m pip --disable-pip-version-check -q)
# the versions membench is tested with (pyproject.toml's ranges, as installed by scripts/install.sh)
binary=(hydra-core==1.3.8 omegaconf==2.3.1 hydra-submitit-launcher==1.2.0 submitit==1.5.4 nvidia-ml-py==13.615.71)
"${pip[@]}" download --no-deps --only-binary=:all: --python-version "$python_version" --implementation cp \
  --platform manylinux2014_x86_64 -d "$dest" "${binary[@]}" 2>&1 | grep -v "is ignored" || true
# antlr4-python3-runtime 4.9.3 (what omegaconf 2.3 pins) is published as an sdist only: build its
# (pure-Python) wheel here
"${pip[@]}" wheel --no-deps -w "$dest" antlr4-python3-runtime==4.9.3 2>&1 | grep -v "is ignored" || true
count=$(ls "$dest"/*.whl 2>/dev/null | wc -l)
size=$(du -sh "$dest" | cut -f1)
echo "[gpu_wheels] $count wheels in $dest ($size): carry them with the repository to the GPU host"
[[ $count -ge 6 ]] || { echo "[gpu_wheels] expected 6 wheels" >&2; exit 1; }
