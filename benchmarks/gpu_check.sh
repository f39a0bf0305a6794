#!/usr/bin/env bash
# The one command for a machine with a GPU: builds the CUDA layers (and ringzero._C with them when
# torch has CUDA), runs the C++ and Python GPU tests and the CUDA benchmark, and writes everything
# under $OUT when set, else under benchmarks/results/.
#   bash benchmarks/gpu_check.sh            # everything (typically 3-6 minutes on a 16-core GPU machine)
#   bash benchmarks/gpu_check.sh build      # or one step: build | ctest | pytest | bench (a run must fit
#                                           # 10 minutes on a lent machine; steps after build reuse build/gpu)
# Needs nvcc, cmake and ninja; the Python half also needs a CUDA build of torch (it says so and fails
# otherwise). Uses the nvidia-nccl-cu13 wheel when installed; needs no network. One build directory
# serves both halves, and every step has a time limit, so the run stays under 10 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
RESULTS=${OUT:-$ROOT/benchmarks/results}
mkdir -p "$RESULTS"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
LOG="$RESULTS/gpu_check_$STAMP.log"
exec > >(tee -a "$LOG") 2>&1
PY=${PYTHON:-python3}
JOBS=${MAX_JOBS:-$(nproc)}
STEP=${1:-all}
case "$STEP" in all|build|ctest|pytest|bench) ;; *) echo "usage: $0 [all|build|ctest|pytest|bench]"; exit 2;; esac
want() { [ "$STEP" = all ] || [ "$STEP" = "$1" ]; }
status=0

echo "== ringzero gpu_check, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi: not available"
nvcc --version | tail -2
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"
TORCH_CUDA=0
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" && TORCH_CUDA=1
NCCL_ROOT=$("$PY" -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)

echo "== 1. build: layers 1-3, their C++ tests$([ $TORCH_CUDA = 1 ] && echo ', ringzero._C'), NCCL: ${NCCL_ROOT:-not installed (loopback only)}"
CFG=(-DCMAKE_BUILD_TYPE=Release -DRINGZERO_CUDA=ON ${NCCL_ROOT:+-DRINGZERO_NCCL_ROOT=$NCCL_ROOT})
if [ $TORCH_CUDA = 1 ]; then
  CFG+=(-DRINGZERO_BUILD_PYTHON=ON "-DCMAKE_PREFIX_PATH=$("$PY" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
        "-DPython3_EXECUTABLE=$(command -v "$PY")" "-DCMAKE_LIBRARY_OUTPUT_DIRECTORY=$ROOT/python/ringzero")
fi
# --threads=0: nvcc compiles sm_80 and sm_90 of one file in parallel (ring.cu is the long pole).
cmake -S . -B build/gpu -G Ninja "${CFG[@]}" -DCMAKE_CUDA_FLAGS=--threads=0
if want build || [ ! -f build/gpu/test_cuda ]; then timeout 360 cmake --build build/gpu -j "$JOBS"; fi

if want ctest; then
  echo "== 2. C++ tests (ctest)"
  if ! timeout 150 ctest --test-dir build/gpu --output-on-failure | tee "$RESULTS/ctest_$STAMP.txt"; then status=1; fi
  if grep -q "Skipped" "$RESULTS/ctest_$STAMP.txt"; then
    echo "gpu_check: a CUDA test skipped, so no GPU was visible to it"; status=1
  fi
fi

if [ $TORCH_CUDA = 1 ]; then
  export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
  "$PY" -c "import ringzero, ringzero._C as C; print(ringzero.__file__, 'has_cuda', C.has_cuda, 'has_nccl', C.has_nccl)"
  if want pytest; then
    echo "== 3. Python GPU tests"
    if ! timeout 240 "$PY" -m pytest -q -rs tests/test_cuda.py; then status=1; fi
  fi
  if want bench; then
    echo "== 4. CUDA benchmark"
    if ! timeout 150 "$PY" benchmarks/bench_cuda.py --out "$RESULTS/bench_cuda_$STAMP.txt"; then status=1; fi
  fi
elif want pytest || want bench; then
  echo "== 3 NOT RUN: this torch has no CUDA, so the Python GPU tests cannot run here"
  status=1
fi
if want bench; then
  echo "== 5. CUDA kernel benchmark without torch (layers 2-3)"
  if ! timeout 150 build/gpu/bench_cuda_kernels | tee "$RESULTS/bench_cuda_kernels_$STAMP.txt"; then status=1; fi
fi
echo "== gpu_check done, status $status; log: $LOG"
exit $status
