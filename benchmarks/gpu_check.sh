#!/usr/bin/env bash
# The one command for a machine with a GPU: builds the CUDA layers (and ringzero._C with them when
# torch has CUDA), runs the C++ and Python GPU tests (the fuzz of every collective on simulated ranks
# and over N processes, and the missing-peer timeout tests among them) and the CUDA benchmarks, and
# writes everything under $OUT when set, else under benchmarks/results/.
#   bash benchmarks/gpu_check.sh            # build, ctest, pytest, bench: at most 10 minutes (GPU_CHECK_BUDGET_S=570)
#   bash benchmarks/gpu_check.sh train      # ringzero train --device cuda --compare, 2 ranks on one GPU (a second
#                                           # 10-minute call; `full` runs all and train with a 1200 s budget)
#   bash benchmarks/gpu_check.sh compile    # stock DDP under torch.compile on "ringzero", 2 ranks on one GPU
#                                           # (inductor compiles per rank: its own call, in `full` too)
#   bash benchmarks/gpu_check.sh build      # or one step: build | ctest | pytest | bench | train | compile
#                                           # (steps after build reuse build/gpu)
# Each step has its own time limit, cut to what is left of the budget; a step the budget no longer
# covers is reported NOT RUN and fails the run. RINGZERO_FUZZ_SEED (printed; random when unset) and
# RINGZERO_FUZZ_CASES (default 300) drive both fuzzers. Needs nvcc, cmake and ninja; the Python half
# also needs a CUDA build of torch (it says so and fails otherwise). Uses the nvidia-nccl-cu13 wheel
# when installed; needs no network.
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
case "$STEP" in all|full|build|ctest|pytest|bench|train|compile) ;;
  *) echo "usage: $0 [all|full|build|ctest|pytest|bench|train|compile]"; exit 2;; esac
want() {  # all: every step but train and compile; full: every step
  [ "$STEP" = full ] || [ "$STEP" = "$1" ] || { [ "$STEP" = all ] && [ "$1" != train ] && [ "$1" != compile ]; }
}
status=0
DEFAULT_BUDGET_S=570
[ "$STEP" = full ] && DEFAULT_BUDGET_S=1200
DEADLINE=$(( $(date +%s) + ${GPU_CHECK_BUDGET_S:-$DEFAULT_BUDGET_S} ))
# step LIMIT_S NAME CMD...: runs CMD under min(LIMIT_S, what is left of the budget); a failure or a
# timeout sets status=1.
step() {
  local limit=$1 name=$2 left
  shift 2
  left=$(( DEADLINE - $(date +%s) ))
  if [ "$left" -lt 20 ]; then echo "== $name NOT RUN: the time budget is spent"; status=1; return 0; fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (time limit ${limit} s)"
  if ! timeout -k 10 "$limit" "$@"; then echo "== $name FAILED or ran past ${limit} s"; status=1; fi
}
export RINGZERO_FUZZ_SEED=${RINGZERO_FUZZ_SEED:-$(( (RANDOM << 15) | RANDOM ))}
export RINGZERO_FUZZ_CASES=${RINGZERO_FUZZ_CASES:-300}

echo "== ringzero gpu_check, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "fuzz: RINGZERO_FUZZ_SEED=$RINGZERO_FUZZ_SEED RINGZERO_FUZZ_CASES=$RINGZERO_FUZZ_CASES (set them to repeat this run)"
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
if want build || [ ! -f build/gpu/test_cuda_fuzz ]; then
  step 300 "build" cmake --build build/gpu -j "$JOBS"
  [ $status = 0 ] || { echo "== gpu_check: the build failed; nothing else runs"; exit 1; }
fi

if want ctest; then
  # cuda (fixed cases), cuda_fuzz (random, seed above), cuda_timeout (a rank that never arrives), core, adam
  # -V: every test's own lines reach the log (the fuzz's seed, the check counts)
  step 170 "2. C++ tests (ctest)" bash -c "set -o pipefail; ctest --test-dir build/gpu -V | tee '$RESULTS/ctest_$STAMP.txt'"
  if grep -q "Skipped" "$RESULTS/ctest_$STAMP.txt" 2>/dev/null; then
    echo "gpu_check: a CUDA test skipped, so no GPU was visible to it"; status=1
  fi
fi

if [ $TORCH_CUDA = 1 ]; then
  export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
  "$PY" -c "import ringzero, ringzero._C as C; print(ringzero.__file__, 'has_cuda', C.has_cuda, 'has_nccl', C.has_nccl)"
  if want pytest; then
    # test_backend_cuda: the "ringzero" c10d backend on CUDA tensors (ops at 2-3 processes, DDP/FSDP2 at 2 and 4,
    # 10 training steps, a rank missing at the CUDA rendezvous); not yet timed on a GPU, hence the larger limit.
    step 300 "3. Python GPU tests (fixed cases, fuzz, missing peer, multi-tensor Adam and its graph capture, c10d backend)" \
      "$PY" -m pytest -q -rs tests/test_cuda.py tests/test_cuda_fuzz.py tests/test_cuda_timeout.py tests/test_adam_cuda.py \
      tests/test_backend_cuda.py -k "not compiled"
  fi
  if want compile; then
    step 400 "3b. stock DDP under torch.compile on the ringzero backend, CUDA tensors (2 ranks on one GPU)" \
      "$PY" -m pytest -q -rs tests/test_backend_cuda.py -k "compiled and 2"
  fi
  if want bench; then
    step 150 "4. CUDA benchmark" "$PY" benchmarks/bench_cuda.py --out "$RESULTS/bench_cuda_$STAMP.txt"
    step 120 "4b. fused Adam benchmark against torch's fused AdamW" "$PY" benchmarks/optim.py --device cuda \
      --out "$RESULTS/optim_cuda_$STAMP.txt"
  fi
  if want train; then
    # Every strategy beside stock torch, then the CUDA losses against the CPU run of the same seed and
    # --resume on CUDA (benchmarks/train_cuda_check.py states its tolerances).
    step 300 "6. ringzero train on CUDA: 2 ranks sharing one GPU (CUDA IPC), beside stock torch" bash -c \
      "set -o pipefail; '$PY' -m ringzero train --device cuda --nproc 2 --steps 20 --val-every 10 --no-progress \
       --compare ddp,torch-ddp,zero1,zero2,zero3,torch-fsdp2,pp,pp+zero1,pp+zero2 --out '$RESULTS/train_cuda_$STAMP' \
       | tee '$RESULTS/train_cuda_$STAMP.txt'"
    step 280 "7. CUDA losses against the CPU run, and --resume on CUDA" bash -c \
      "set -o pipefail; '$PY' benchmarks/train_cuda_check.py --nproc 2 --steps 12 --strategies ddp,zero2,zero3,pp,pp+zero1 \
       | tee '$RESULTS/train_cuda_check_$STAMP.txt'"
  fi
elif want pytest || want bench || want train || want compile; then
  echo "== 3-7 NOT RUN: this torch has no CUDA, so the Python GPU steps cannot run here"
  status=1
fi
if want bench; then
  step 120 "5. CUDA kernel benchmark without torch (layers 2-3)" bash -c \
    "set -o pipefail; build/gpu/bench_cuda_kernels | tee '$RESULTS/bench_cuda_kernels_$STAMP.txt'"
fi
echo "== gpu_check done, status $status; log: $LOG"
exit $status
