#!/usr/bin/env bash
# Validate membench's CUDA path on a GPU host in one command, with the host's own torch (never touched):
# PASS / FAIL / SKIP per check, all of them in DIR/gpu_check.json (bench/apps/gpu_check.py says what each
# check proves). About 4 minutes on one H200; stops by 8.
#
#   scripts/gpu_check.sh --out DIR      # on the GPU host; its pure-Python needs come from .wheels/ (made by
#                                       # scripts/gpu_wheels.sh where pip works) into .gpu-venv, offline
#   scripts/gpu_check.sh --simulate --out DIR   # on any machine: the same flow on CPU against a simulated
#                                               # GPU (hardware.simulate: the caching allocator model)
#
# Without a GPU (and without --simulate) it says so in one line and exits 2. PYTHON=... picks the python
# whose torch to use (default python3).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ "${1:-}" == "--simulate" || "${1:-}" == "--dry-run" ]]; then
  shift
  bash "$repo_root/scripts/install.sh" >/dev/null
  python_bin="${MEMBENCH_VENV:-$repo_root/.venv}/bin/python"
  exec env PYTHONPATH="$repo_root" timeout 480 "$python_bin" -m bench.apps.gpu_check --simulate \
    --width 512 --batch 256 --steps 6 "$@"
fi
system_python="${PYTHON:-python3}"
if ! "$system_python" -c "import torch" 2>/dev/null; then  # no torch is not the same as no GPU (N20)
  echo "gpu check: $system_python has no torch; name the python whose torch to check with PYTHON=..." >&2
  exit 2
fi
if ! "$system_python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu check: no CUDA device visible to $system_python's torch here; run it on a GPU host (or --simulate)" >&2
  exit 2
fi
imports="import hydra, omegaconf, submitit, pynvml, hydra_plugins.hydra_submitit_launcher"
needed=(hydra-core omegaconf antlr4-python3-runtime hydra-submitit-launcher submitit nvidia-ml-py)
extra_path=""
if "$system_python" -c "$imports" 2>/dev/null; then
  python_bin="$system_python"  # a venv (e.g. .venv) that has everything already
else
  # A venv over the system's packages: torch stays the host's, what is missing goes into .gpu-venv only
  venv="$repo_root/.gpu-venv"
  if [[ -x "$venv/bin/python" ]] || "$system_python" -m venv --system-site-packages "$venv" 2>/dev/null; then
    python_bin="$venv/bin/python"
    if ! "$python_bin" -c "$imports" 2>/dev/null; then
      if [[ -d "$repo_root/.wheels" ]]; then
        "$python_bin" -m pip install -q --no-index --no-deps --find-links "$repo_root/.wheels" "${needed[@]}"
      else
        "$python_bin" -m pip install -q --no-deps "${needed[@]}" || {
          echo "gpu check: hydra-core and friends are missing and there is no .wheels/; run scripts/gpu_wheels.sh" \
            "where pip works and bring .wheels/ along" >&2; exit 2; }
      fi
    fi
  else
    # no venv here (a Debian python without ensurepip, N19): the wheels are pure Python, importable as zips
    rm -rf "$venv"
    python_bin="$system_python"
    extra_path="$(ls "$repo_root"/.wheels/*.whl 2>/dev/null | paste -sd: -)"
    if ! PYTHONPATH="$extra_path" "$python_bin" -c "$imports" 2>/dev/null; then
      echo "gpu check: $system_python cannot make a venv (no ensurepip) and .wheels/ does not hold hydra-core and" \
        "friends; run scripts/gpu_wheels.sh where pip works and bring .wheels/ along" >&2
      exit 2
    fi
    echo "[gpu_check] no venv here (ensurepip missing): the .wheels/ zips are on PYTHONPATH" >&2
  fi
fi
"$python_bin" -c "import torch; print(f'[gpu_check] torch {torch.__version__}, CUDA {torch.version.cuda}, ' \
  f'{torch.cuda.device_count()} GPU(s)')"
exec env PYTHONPATH="$repo_root${extra_path:+:$extra_path}" timeout 480 "$python_bin" -m bench.apps.gpu_check "$@"
