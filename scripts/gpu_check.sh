#!/usr/bin/env bash
# Validate membench's CUDA recording backend on a GPU machine in one command, with stock PyTorch only
# (no torchrec/fbgemm needed). Prints one line per check; exits non-zero if any fails.
#
#   scripts/gpu_check.sh            # on a machine with a CUDA GPU and torch installed
#   scripts/gpu_check.sh --dry-run  # on any machine: CUDA/NVML calls replaced by fakes (CI runs this)
#
# Needs: a python with torch (PYTHON=..., default python3) and, for NVML, the nvidia-ml-py wheel: if
# `pynvml` is missing it is installed from PyPI, or from ./.gpu-wheels/ on machines without a network
# (fill it beforehand with: pip download --no-deps -d .gpu-wheels nvidia-ml-py).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python_bin="${PYTHON:-python3}"
if [[ "${1:-}" == "--dry-run" ]]; then
  shift
  bash "$repo_root/scripts/install.sh" >/dev/null
  python_bin="${MEMBENCH_VENV:-$repo_root/.venv}/bin/python"
  exec env PYTHONPATH="$repo_root" timeout 300 "$python_bin" -m bench.apps.gpu_check --dry-run \
    --width 512 --batch 256 --steps 6 "$@"
fi
if ! "$python_bin" -c "import pynvml" 2>/dev/null; then
  if [[ -d "$repo_root/.gpu-wheels" ]]; then
    "$python_bin" -m pip install -q --no-index --find-links "$repo_root/.gpu-wheels" nvidia-ml-py
  else
    "$python_bin" -m pip install -q nvidia-ml-py || echo "[gpu_check] nvidia-ml-py not installed: NVML checks will fail"
  fi
fi
"$python_bin" -c "import torch; print(f'[gpu_check] torch {torch.__version__}, cuda {torch.version.cuda}, ' \
  f'{torch.cuda.device_count()} GPU(s)')"
exec env PYTHONPATH="$repo_root" timeout 300 "$python_bin" -m bench.apps.gpu_check "$@"
