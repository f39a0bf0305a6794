#!/usr/bin/env bash
# A GPU user's install, checked on a machine without a GPU: in a virtual environment of its own with a
# CUDA build of torch (the registry's wheel and its nvidia runtime wheels, about 3.5 GB, about a minute
# to download), `pip install --no-build-isolation .` compiles and links the whole extension with nvcc,
# CUDA path and NCCL included, for sm_90a (RINGZERO_CUDA_TORCH_ARCHS, a TORCH_CUDA_ARCH_LIST, picks others: the
# checkout's own build compiles every .cu file for sm_80 and tools/cuda_static_check.py the kernels for both, so
# one architecture here: the phase 6:13 -> 5:29 on the 2-core VM); then, in that environment:
#   - `import ringzero` loads it (every symbol of _C resolved against torch's CUDA libraries at load),
#     and the build says it has CUDA and NCCL;
#   - a CUDA call without a GPU raises a clear Python error, not a crash (tests/helpers/run_cuda_install_check.py);
#   - the CPU tests that touch the CUDA build's code paths pass, and the GPU tests skip, saying why.
#   bash tools/cuda_torch_build.sh          # tools/test.sh runs it where nvcc is installed
#   bash tools/cuda_torch_build.sh build    # only the environment and the build (kept in build/cuda-torch-src)
#   bash tools/cuda_torch_build.sh check    # then the checks on that build (tools/test.sh builds in the
#                                           # background while pytest runs, and checks after it)
# The environment is kept in RINGZERO_CUDA_ENV (default ~/.cache/ringzero/cuda-env-<torch version>) and
# reused when its torch is the CUDA build asked for; RINGZERO_CUDA_TORCH_VERSION picks the torch release
# (default 2.13.0, the README's). The build runs in a copy of the tracked files, so the checkout's own
# build stays the CPU one. Takes about 5 minutes on 2 cores (the build about 3).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
PART=${1:-all}
case "$PART" in all|build|check) ;; *) echo "usage: $0 [build|check]" >&2; exit 2;; esac
TORCH_V=${RINGZERO_CUDA_TORCH_VERSION:-2.13.0}
ENV=${RINGZERO_CUDA_ENV:-$HOME/.cache/ringzero/cuda-env-$TORCH_V}
command -v nvcc >/dev/null 2>&1 || { echo "cuda_torch_build: nvcc is not installed, so there is no CUDA build to check" >&2; exit 1; }
START=$(date +%s)
say() { echo "cuda_torch_build [$(( $(date +%s) - START )) s]: $*"; }

has_cuda_torch() {
  [ -x "$ENV/bin/python" ] && "$ENV/bin/python" - "$TORCH_V" <<'EOF' 2>/dev/null
import sys, torch
sys.exit(0 if torch.version.cuda and torch.__version__.split("+")[0] == sys.argv[1] else 1)
EOF
}
if [ "$PART" != check ]; then
if ! has_cuda_torch; then
  say "making $ENV with torch $TORCH_V (CUDA build) and the build tools"
  rm -rf "$ENV"
  "$PY" -m venv "$ENV"
  # PIP_CONFIG_FILE=/dev/null, PIP_FIND_LINKS empty: this machine's pip configuration points at CPU builds.
  PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= "$ENV/bin/python" -m pip install -q "torch==$TORCH_V"
  "$ENV/bin/python" -m pip install -q numpy pytest expecttest pybind11 ninja "cmake>=3.22" "setuptools>=64" wheel \
    nvidia-nccl-cu13
fi
say "$("$ENV/bin/python" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)')"
fi

# The copy of the tracked files the build runs in: a temporary folder, or with `build` and `check` one
# that the first leaves to the second.
if [ "$PART" = all ]; then
  SRC=$(mktemp -d)
  trap 'rm -rf "$SRC"' EXIT
else
  SRC=$ROOT/build/cuda-torch-src
fi
if [ "$PART" != check ]; then
rm -rf "$SRC" && mkdir -p "$SRC"
git ls-files -co --exclude-standard -z | while IFS= read -r -d '' f; do
  if [ -f "$f" ]; then mkdir -p "$SRC/$(dirname "$f")" && cp -p "$f" "$SRC/$f"; fi
done
ARCHS=${RINGZERO_CUDA_TORCH_ARCHS:-9.0a}
say "building ringzero with nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') (TORCH_CUDA_ARCH_LIST=$ARCHS)"
(cd "$SRC" && TORCH_CUDA_ARCH_LIST="$ARCHS" MAX_JOBS=${MAX_JOBS:-2} \
   "$ENV/bin/python" -m pip install -q --no-build-isolation --no-deps --force-reinstall .)
say "built"
[ "$PART" = build ] && exit 0
fi
[ -d "$SRC/tests" ] || { echo "cuda_torch_build check: no build in $SRC (run \`$0 build\` first)" >&2; exit 1; }
cd "$SRC/tests"  # not the checkout's python/: the installed build must be the one imported
"$ENV/bin/python" helpers/run_cuda_install_check.py
say "import and the no-GPU errors checked"
"$ENV/bin/python" -m pytest -q -rs -p no:cacheprovider cuda/test_bench_cuda_args.py backend/test_backend_ops.py cuda/test_cuda.py
say "done"
[ "$PART" = check ] && rm -rf "$SRC"
exit 0
