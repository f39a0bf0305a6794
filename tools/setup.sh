#!/usr/bin/env bash
# Installs what ringzero needs on a fresh machine and builds it (editable, against the installed torch).
# Keeps an existing torch (e.g. a CUDA build on a GPU machine); otherwise installs the CPU torch 2.13.0.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q torch==2.13.0
fi
# numpy/pytest/tqdm/matplotlib for the package and its tests; cmake/ninja build it; the NCCL wheel gives
# nccl.h to the CUDA sources (compiled whenever nvcc is present, even on a CPU machine).
"$PY" -m pip install -q numpy pytest tqdm matplotlib ninja "cmake>=3.22" pybind11
if command -v nvcc >/dev/null 2>&1; then
  "$PY" -m pip install -q nvidia-nccl-cu13
fi
"$PY" -m pip install -q --no-build-isolation --no-deps -e .
