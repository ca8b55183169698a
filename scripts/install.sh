#!/usr/bin/env bash
# Creates (or reuses) .venv and installs membench with the right fbgemm build for this machine.
# torchrec 1.8.0 declares a dependency on `fbgemm-gpu` (the CUDA build, ~465 MB), which fails to import
# on a CPU-only machine, so torchrec is installed with --no-deps and its runtime deps are listed here.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MEMBENCH_VENV:-$repo_root/.venv}"
stamp="$venv/.membench-installed"
python_bin="${PYTHON:-python3}"

TORCH_VERSION="2.13.0"
TORCHREC_VERSION="1.8.0"
FBGEMM_VERSION="1.8.0"

if [[ ! -x "$venv/bin/python" ]]; then
  echo "[install] creating virtualenv at $venv"
  "$python_bin" -m venv "$venv"
fi
# This machine's pip config lists local wheel folders that warn on every lookup: drop that noise.
pip_quiet() { "$@" 2>&1 | sed -e '/is ignored: it is neither a file nor a directory/d' \
  -e "/torchrec .* requires fbgemm-gpu, which is not installed/d" -e "/dependency resolver does not currently/d"; }
pip=(pip_quiet "$venv/bin/python" -m pip --disable-pip-version-check -q)

# A GPU: nvidia-smi lists one, or the driver does (hosts without nvidia-smi on PATH). torch 2.13's CUDA
# build is CUDA 13.0 and needs an R580+ driver; fbgemm-gpu 1.8.0 is its matching build.
if { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; } ||
   compgen -G "/proc/driver/nvidia/gpus/*" >/dev/null; then
  fbgemm="fbgemm-gpu==$FBGEMM_VERSION"
  echo "[install] CUDA device found: using $fbgemm (CUDA build; torch $TORCH_VERSION needs an R580+ driver)"
else
  fbgemm="fbgemm-gpu-cpu==$FBGEMM_VERSION"
  echo "[install] no CUDA device found: using $fbgemm (CPU build)"
fi

# membench's own bytecode, written ahead (0.3 s; only what changed): with PYTHONDONTWRITEBYTECODE set, as on
# this project's machines, every process would otherwise compile membench's modules anew (0.3 s of each
# command, agent and rank)
compile_sources() { "$venv/bin/python" -m compileall -q -j 0 "$repo_root/bench" "$repo_root/workloads" >/dev/null; }

# Re-install only when the wanted set changed: keeps the two README commands fast on a warm machine.
want="torch==$TORCH_VERSION $fbgemm torchrec==$TORCHREC_VERSION $(sha1sum "$repo_root/pyproject.toml" | cut -c1-12)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "[install] reusing $venv"
  compile_sources
  exit 0
fi

echo "[install] installing torch==$TORCH_VERSION, $fbgemm, torchrec==$TORCHREC_VERSION (no deps)"
"${pip[@]}" install "torch==$TORCH_VERSION" "$fbgemm"
"${pip[@]}" install --no-deps "torchrec==$TORCHREC_VERSION"
echo "[install] installing membench and its dependencies"
"${pip[@]}" install -e "$repo_root[test]"
compile_sources
echo "$want" > "$stamp"
echo "[install] done: $venv"
