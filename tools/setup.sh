#!/usr/bin/env bash
# Installs what ringzero needs on a fresh machine and builds it (editable, against the installed torch).
# Keeps an existing torch in the supported range 2.10-2.15 (e.g. a CUDA build on a GPU machine), refuses
# one outside it, and installs the CPU torch 2.13.0 only when there is none.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# An earlier editable install of ringzero whose checkout has moved or gone leaves torch's backend entry point
# pointing at a module that no longer exists, and then `import torch` itself fails; the steps below import
# torch only to read its version, so they do it with autoload off, and the install at the end rebinds it.
export TORCH_DEVICE_BACKEND_AUTOLOAD=0
# The supported torch releases (also in pyproject.toml and the README); tools/torch_compat.sh checks the ends.
TORCH_MIN=2.10 TORCH_MAX=2.15
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q torch==2.13.0
elif ! have=$("$PY" - "$TORCH_MIN" "$TORCH_MAX" <<'PYEOF'
import sys, torch
release = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
low, high = (tuple(int(p) for p in v.split(".")) for v in sys.argv[1:3])
print(torch.__version__)
sys.exit(0 if low <= release <= high else 1)
PYEOF
); then
  echo "tools/setup.sh: torch $have is installed, but ringzero supports torch $TORCH_MIN to $TORCH_MAX (CPU or" \
       "CUDA builds). Install one of those into this environment (for example: pip install torch==2.13.0)," \
       "or run this with PYTHON= pointing at an environment that has one." >&2
  exit 1
fi
# numpy/pytest/tqdm/matplotlib for the package and its tests (expecttest: torch's own test suite, which
# tests/helpers/torch_suite runs, imports it); cmake and ninja build it; setuptools and wheel because
# --no-build-isolation builds with what is installed (a new venv has neither a recent setuptools nor
# wheel); the NCCL wheel gives nccl.h to the CUDA sources (compiled whenever nvcc is present), and
# cuobjdump with the nvdisasm it runs disassemble them for tools/cuda_static_check.py.
"$PY" -m pip install -q numpy pytest tqdm matplotlib ninja "cmake>=3.22" pybind11 "setuptools>=64" wheel expecttest
if command -v nvcc >/dev/null 2>&1; then
  "$PY" -m pip install -q nvidia-nccl-cu13 nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
fi
# The host lab (tests/helpers/hostlab.py) needs iproute2 (ip, tc) and util-linux (unshare, nsenter), and root;
# its tests fail naming what is missing. Installed here where apt-get and root are at hand.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  for tool in ip tc unshare nsenter; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      apt-get update -q >/dev/null && apt-get install -y -q iproute2 util-linux >/dev/null
      break
    fi
  done
fi
# PyTorch Lightning, Ray Train and HF Accelerate for tests/backend/test_frameworks.py (and transformers, the
# optional extra `hf`, for tests/parallel/test_hf_plans.py; deepspeed, the extra `baselines`, for the deepspeed-zero
# rows of tests/trainer/test_train_baselines.py), constrained to the torch
# already here so that they can never replace it. The constraint takes the version pip recorded, not
# torch.__version__: the registry's CUDA wheels say "2.10.0+cu128" there but "2.10.0" to pip, and a
# constraint on the former cannot be met (pip stopped with ResolutionImpossible, 2026-11-26).
TORCH_HERE=$("$PY" -c "import importlib.metadata as m; print(m.version('torch'))")
"$PY" -m pip install -q lightning "ray[train]" accelerate "transformers>=5.24" "deepspeed>=0.19.8" -c <(echo "torch==$TORCH_HERE")
"$PY" -m pip install -q --no-build-isolation --no-deps -e .
