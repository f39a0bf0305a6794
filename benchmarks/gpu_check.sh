#!/usr/bin/env bash
# The one command for a machine with a GPU: builds the CUDA layers (and ringzero._C with them when
# torch has CUDA) for that GPU's own architecture, runs the C++ and Python GPU tests (the fuzz of every
# collective on simulated ranks and over N processes, and the missing-peer timeout tests among them) and
# the CUDA benchmarks, and writes everything under $OUT when set, else under benchmarks/results/.
#   bash benchmarks/gpu_check.sh            # build, ctest, pytest, bench: 580 s budget (took 308 s on an H200)
#   bash benchmarks/gpu_check.sh train      # ringzero train --device cuda --compare, 2 ranks on one GPU, and
#                                           # zeropp on CUDA: a second call (580 s budget without the build;
#                                           # took 308-344 s on an H200 before zeropp's step was added)
#   bash benchmarks/gpu_check.sh compile    # stock DDP under torch.compile on "ringzero", 2 ranks on one GPU
#                                           # (inductor compiles per rank): 140 s budget without the build
#                                           # (took 47 s on an H200)
# One 15-minute device draw holds all three (2026-11-28, second draw): call 1 `gpu_check.sh` then
# `GPU_CHECK_BUDGET_S=<what is left of 580> gpu_check.sh compile` (355 s), call 2 on the still-warm machine
# `gpu_check.sh train` (the build reused; 344 s), plus a machine start of about a minute.
#   bash benchmarks/gpu_check.sh plan [S]   # print the plan of step S (default all) and exit 0
#   bash benchmarks/gpu_check.sh build      # or one step: build | ctest | pytest | bench | train | compile
#                                           # (steps after build reuse build/gpu); `full` runs every step
#                                           # (no single 10-minute call holds it)
# The first lines printed are the plan: each step, its time limit, the total budget. A step runs under
# its own limit, cut to what is left of the budget; a step the budget no longer covers is reported NOT
# RUN and fails the run. The budget (GPU_CHECK_BUDGET_S overrides it) is the sum of the limits of the
# steps that will run plus SETUP_S for the lines before the build. The limits come from the first
# device run (an H200, 2026-11-28: benchmarks/RESULTS.md, "gpu_check.sh on a device"); every step prints
# how long it took, so each run can check the plan.
# The build targets only the GPU's own architecture (nvidia-smi's compute capability, e.g. 9.0 -> sm_90,
# through TORCH_CUDA_ARCH_LIST, which cmake/cuda.cmake honours); a TORCH_CUDA_ARCH_LIST already set wins,
# and without nvidia-smi the build keeps the default (sm_80 and sm_90). The CPU grid (CI runs it) is not
# built. RINGZERO_FUZZ_SEED (printed; random when unset) and RINGZERO_FUZZ_CASES (default 300) drive both
# fuzzers. Needs nvcc, cmake and ninja; the Python half also needs a CUDA build of torch (it says so and
# fails otherwise). Uses the nvidia-nccl-cu13 wheel when installed; needs no network.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
JOBS=${MAX_JOBS:-$(nproc)}
STEP=${1:-all}
PLAN_ONLY=0
if [ "$STEP" = plan ]; then PLAN_ONLY=1; STEP=${2:-all}; fi
case "$STEP" in all|full|build|ctest|pytest|bench|train|compile) ;;
  *) echo "usage: $0 [plan] [all|full|build|ctest|pytest|bench|train|compile]"; exit 2;; esac
want() {  # all: every step but train and compile; full: every step
  [ "$STEP" = full ] || [ "$STEP" = "$1" ] || { [ "$STEP" = all ] && [ "$1" != train ] && [ "$1" != compile ]; }
}

# ---- the time plan (seconds). First planned on 2026-11-27 from build times on a 2-core machine; the
# limits below come from the first run of this script on a device (an H200, 16 cores, 2026-11-28,
# benchmarks/results/h200-2026-11-28 and h200-2026-11-28-b): setup 4-12 s, build 43-62 s, ctest 30-40 s,
# pytest 156 s (all passing; 100 s with 5 failing at start), bench 7 s, optim 12-13 s, ringzero bench 21-25 s,
# kernel bench 1 s, compile 36 s, train 104-118 s, train check 195-218 s. Each limit is 1.5-3x its
# measurement (the build's plus the two-arch fallback), so that `all` still fits one 600 s device call.
SETUP_S=20            # nvidia-smi, nvcc, one torch import: everything before step 1
L_BUILD=100           # 1. configure + compile + link, the GPU's arch only
L_CTEST=80            # 2. ctest: every test of build/gpu (the CPU grid is not built here: CI runs it)
L_PYTEST=240          # 3. pytest of the GPU test files (about 10 multi-process runs)
L_BENCH=30            # 4. benchmarks/bench_cuda.py
L_OPTIM=30            # 4b. benchmarks/optim.py --device cuda
L_KBENCH=20           # 5. build/gpu/bench_cuda_kernels
L_RZBENCH=60          # 4c. ringzero bench --device cuda, simulated ranks and processes
L_COMPILE=120         # 3b. compiled stock DDP, 2 ranks (inductor compiles in each rank)
L_TRAIN=170           # 6. ringzero train --compare, 9 strategies
L_TRAINCHK=300        # 7. CUDA losses against the CPU run, and --resume
L_ZEROPP=90           # 8. zeropp on CUDA tensors, 2 ranks on one GPU (not yet timed on a device)

BUILD_NEEDED=0
if want build || [ ! -f build/gpu/test_cuda_fuzz ]; then BUILD_NEEDED=1; fi

# The GPU's own architecture, unless TORCH_CUDA_ARCH_LIST already names one.
if [ -n "${TORCH_CUDA_ARCH_LIST:-}" ]; then
  ARCH_NOTE="TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST (set by the caller)"
else
  CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' \r' || true)
  if [[ "$CAP" =~ ^[0-9]+\.[0-9]+$ ]]; then
    export TORCH_CUDA_ARCH_LIST=$CAP
    ARCH_NOTE="sm_${CAP/./} only (the GPU's compute capability $CAP, from nvidia-smi)"
  else
    ARCH_NOTE="sm_80 and sm_90 (the default: nvidia-smi gave no compute capability)"
  fi
fi

PLAN=()   # "limit|what" per step that will run, in order
[ $BUILD_NEEDED = 1 ] && PLAN+=("$L_BUILD|1. build: configure, layers 1-3 and their C++ tests, ringzero._C when torch has CUDA; $ARCH_NOTE")
want ctest && PLAN+=("$L_CTEST|2. C++ tests (ctest): the CUDA ones (fixed cases, fuzz, timeout, Adam, quantization) and the CPU ones; no CPU grid")
want pytest && PLAN+=("$L_PYTEST|3. Python GPU tests: test_cuda, test_cuda_fuzz, test_cuda_alltoall, test_cuda_timeout, test_adam_cuda, test_quantize_cuda, test_backend_cuda (not compiled)")
want compile && PLAN+=("$L_COMPILE|3b. stock DDP under torch.compile on the ringzero backend, 2 ranks on one GPU")
want bench && PLAN+=("$L_BENCH|4. CUDA benchmark (benchmarks/bench_cuda.py)" "$L_OPTIM|4b. fused Adam benchmark (benchmarks/optim.py --device cuda)"
                     "$L_RZBENCH|4c. ringzero bench --device cuda: 4 simulated ranks, then a process per GPU (2 sharing one GPU where there is one)")
want train && PLAN+=("$L_TRAIN|6. ringzero train --device cuda --compare, 2 ranks on one GPU" "$L_TRAINCHK|7. CUDA losses against the CPU run, --resume on CUDA"
                     "$L_ZEROPP|8. zeropp (ZeRO-3 with ZeRO++'s options) on CUDA tensors, 2 ranks on one GPU")
want bench && PLAN+=("$L_KBENCH|5. CUDA kernel benchmark without torch (build/gpu/bench_cuda_kernels)")
PLANNED_S=$SETUP_S
for p in "${PLAN[@]}"; do PLANNED_S=$(( PLANNED_S + ${p%%|*} )); done
BUDGET_S=${GPU_CHECK_BUDGET_S:-$PLANNED_S}

print_plan() {
  echo "== gpu_check plan: step '$STEP', total budget ${BUDGET_S} s$([ -n "${GPU_CHECK_BUDGET_S:-}" ] && echo " (GPU_CHECK_BUDGET_S; the limits sum to $PLANNED_S s)"), counted from the script's start"
  printf '   %5s s  %s\n' "$SETUP_S" "0. setup: nvidia-smi, nvcc, torch (not a step; its time comes off the budget)"
  for p in "${PLAN[@]}"; do printf '   %5s s  %s\n' "${p%%|*}" "${p#*|}"; done
  [ $BUILD_NEEDED = 1 ] || echo "   (no build: build/gpu already has one)"
  echo "   Each step's limit is cut to what is left of the budget; a step not reached is NOT RUN and fails the run."
  echo "   Limits 1.5-3x the steps' times on an H200 (2026-11-28): build 43-62 s, ctest 30-40, pytest 156,"
  echo "   bench 7 + 12 + 21 + 1, compile 36, train 104-118 + 195-218 (benchmarks/RESULTS.md, \"gpu_check.sh on a device\")."
}
if [ $PLAN_ONLY = 1 ]; then print_plan; exit 0; fi

START=$(date +%s)
DEADLINE=$(( START + BUDGET_S ))
RESULTS=${OUT:-$ROOT/benchmarks/results}
mkdir -p "$RESULTS"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
LOG="$RESULTS/gpu_check_$STAMP.log"
exec > >(tee -a "$LOG") 2>&1
print_plan

status=0
# step LIMIT_S NAME CMD...: runs CMD under min(LIMIT_S, what is left of the budget less the 10 s that
# timeout may wait before it kills), so that even a killed step ends by the deadline; a failure or a
# timeout sets status=1. Says how long the step took.
step() {
  local limit=$1 name=$2 left t0
  shift 2
  left=$(( DEADLINE - $(date +%s) - 10 ))
  if [ "$left" -lt 20 ]; then echo "== $name NOT RUN: the time budget is spent"; status=1; return 0; fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (time limit ${limit} s)"
  t0=$(date +%s)
  if timeout -k 10 "$limit" "$@"; then
    echo "== $name: done in $(( $(date +%s) - t0 )) s"
  else
    echo "== $name FAILED or ran past ${limit} s (after $(( $(date +%s) - t0 )) s)"; status=1
  fi
}
export RINGZERO_FUZZ_SEED=${RINGZERO_FUZZ_SEED:-$(( (RANDOM << 15) | RANDOM ))}
export RINGZERO_FUZZ_CASES=${RINGZERO_FUZZ_CASES:-300}

echo "== ringzero gpu_check, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "fuzz: RINGZERO_FUZZ_SEED=$RINGZERO_FUZZ_SEED RINGZERO_FUZZ_CASES=$RINGZERO_FUZZ_CASES (set them to repeat this run)"
nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi: not available"
nvcc --version | tail -2 || echo "nvcc: not found"
# One Python start for every fact about torch (a cold import of torch takes seconds on a fresh machine).
TORCH_FACTS=$("$PY" -c "
import torch, torch.utils
print(torch.__version__, torch.version.cuda, int(torch.cuda.is_available()), torch.utils.cmake_prefix_path)
try:
    import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])
except ImportError:
    print('')
" 2>/dev/null || true)
TORCH_VERSION="" TORCH_CUDA_VERSION="" TORCH_CUDA=0 TORCH_PREFIX="" NCCL_ROOT=""
{ read -r TORCH_VERSION TORCH_CUDA_VERSION TORCH_CUDA TORCH_PREFIX; read -r NCCL_ROOT; } <<<"$TORCH_FACTS" || true
if [ -n "$TORCH_VERSION" ]; then
  echo "torch $TORCH_VERSION cuda $TORCH_CUDA_VERSION available $([ "$TORCH_CUDA" = 1 ] && echo True || echo False)"
else
  echo "torch: $PY cannot import it:"; "$PY" -c "import torch" 2>&1 | tail -1 || true; TORCH_CUDA=0
fi
echo "== setup done after $(( $(date +%s) - START )) s"

if [ $BUILD_NEEDED = 1 ]; then
  CFG=(-DCMAKE_BUILD_TYPE=Release -DRINGZERO_CUDA=ON -DRINGZERO_CPU_GRID=OFF ${NCCL_ROOT:+-DRINGZERO_NCCL_ROOT=$NCCL_ROOT})
  if [ "$TORCH_CUDA" = 1 ]; then
    CFG+=(-DRINGZERO_BUILD_PYTHON=ON "-DCMAKE_PREFIX_PATH=$TORCH_PREFIX"
          "-DPython3_EXECUTABLE=$(command -v "$PY")" "-DCMAKE_LIBRARY_OUTPUT_DIRECTORY=$ROOT/python/ringzero")
  fi
  # --threads=0: with more than one arch (the fallback), nvcc compiles the archs of one file in parallel
  # (ring.cu is the long pole).
  CONFIGURE=$(printf '%q ' cmake -S . -B build/gpu -G Ninja "${CFG[@]}" -DCMAKE_CUDA_FLAGS=--threads=0)
  step "$L_BUILD" "1. build: layers 1-3, their C++ tests$([ "$TORCH_CUDA" = 1 ] && echo ', ringzero._C'), NCCL: ${NCCL_ROOT:-not installed (loopback only)}; $ARCH_NOTE" \
    bash -c "$CONFIGURE && cmake --build build/gpu -j $JOBS"
  [ $status = 0 ] || { echo "== gpu_check: the build failed; nothing else runs"; exit 1; }
fi

if want ctest; then
  # cuda (fixed cases), cuda_fuzz (random, seed above), cuda_timeout (a rank that never arrives), cuda_adam,
  # core, adam, cuda_schedule
  # -V: every test's own lines reach the log (the fuzz's seed, the check counts)
  step "$L_CTEST" "2. C++ tests (ctest)" bash -c "set -o pipefail; ctest --test-dir build/gpu -V | tee '$RESULTS/ctest_$STAMP.txt'"
  if grep -q "Skipped" "$RESULTS/ctest_$STAMP.txt" 2>/dev/null; then
    echo "gpu_check: a CUDA test skipped, so no GPU was visible to it"; status=1
  fi
fi

if [ "$TORCH_CUDA" = 1 ]; then
  export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
  "$PY" -c "import ringzero, ringzero._C as C; print(ringzero.__file__, 'has_cuda', C.has_cuda, 'has_nccl', C.has_nccl)"
  if want pytest; then
    # test_backend_cuda: the "ringzero" c10d backend on CUDA tensors (ops at 2-3 processes, DDP/FSDP2 at 2 and 4,
    # 10 training steps, a rank missing at the CUDA rendezvous); not yet timed on a GPU.
    step "$L_PYTEST" "3. Python GPU tests (fixed cases, fuzz, missing peer, multi-tensor Adam and its graph capture, block quantization, c10d backend)" \
      "$PY" -m pytest -q -rs tests/cuda/test_cuda.py tests/cuda/test_cuda_fuzz.py tests/cuda/test_cuda_alltoall.py tests/cuda/test_cuda_timeout.py tests/cuda/test_adam_cuda.py \
      tests/cuda/test_quantize_cuda.py tests/cuda/test_backend_cuda.py -k "not compiled"
  fi
  if want compile; then
    step "$L_COMPILE" "3b. stock DDP under torch.compile on the ringzero backend, CUDA tensors (2 ranks on one GPU)" \
      "$PY" -m pytest -q -rs tests/cuda/test_backend_cuda.py -k "compiled and 2"
  fi
  if want bench; then
    step "$L_BENCH" "4. CUDA benchmark" "$PY" benchmarks/bench_cuda.py --out "$RESULTS/bench_cuda_$STAMP.txt"
    step "$L_OPTIM" "4b. fused Adam benchmark against torch's fused AdamW" "$PY" benchmarks/optim.py --device cuda \
      --out "$RESULTS/optim_cuda_$STAMP.txt"
    # The command a user runs, every op (the all-to-all too): every row checks its result (#wrong); NCCL rows
    # where each rank has a GPU.
    NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    [ "${NGPU:-0}" -ge 2 ] || NGPU=2
    RZB=(--device cuda --ops all_reduce,reduce_scatter,all_gather,all_to_all --min-bytes 1K --max-bytes 64M --factor 4 --budget-s 0.05)
    step "$L_RZBENCH" "4c. ringzero bench --device cuda (4 simulated ranks; $NGPU processes)" bash -c \
      "set -o pipefail; '$PY' -m ringzero bench ${RZB[*]} --sim-ranks 4 | tee '$RESULTS/ringzero_bench_cuda_$STAMP.txt' && \
       '$PY' -m ringzero bench ${RZB[*]} --nproc $NGPU | tee -a '$RESULTS/ringzero_bench_cuda_$STAMP.txt'"
  fi
  if want train; then
    # Every strategy beside stock torch, then the CUDA losses against the CPU run of the same seed and
    # --resume on CUDA (benchmarks/train_cuda_check.py states its tolerances).
    step "$L_TRAIN" "6. ringzero train on CUDA: 2 ranks sharing one GPU (CUDA IPC), beside stock torch" bash -c \
      "set -o pipefail; '$PY' -m ringzero train --device cuda --nproc 2 --steps 20 --val-every 10 --no-progress \
       --compare ddp,torch-ddp,zero1,zero2,zero3,torch-fsdp2,pp,pp+zero1,pp+zero2 --out '$RESULTS/train_cuda_$STAMP' \
       | tee '$RESULTS/train_cuda_$STAMP.txt'"
    step "$L_TRAINCHK" "7. CUDA losses against the CPU run, and --resume on CUDA" bash -c \
      "set -o pipefail; '$PY' benchmarks/train_cuda_check.py --nproc 2 --steps 12 --strategies ddp,zero2,zero3,pp,pp+zero1 \
       | tee '$RESULTS/train_cuda_check_$STAMP.txt'"
    # zeropp's CUDA form on one host: qw's gathers against the CPU kernels' bytes, hpz and qg changing nothing
    # there (tests/helpers/run_cuda_zeropp.py); across hosts it needs a GPU per rank.
    step "$L_ZEROPP" "8. zeropp on CUDA tensors (one host, 2 ranks on one GPU)" \
      "$PY" -m pytest -q -rs tests/cuda/test_zeropp_cuda.py
  fi
elif want pytest || want bench || want train || want compile; then
  echo "== 3-7 NOT RUN: this torch has no CUDA, so the Python GPU steps cannot run here"
  status=1
fi
if want bench; then
  step "$L_KBENCH" "5. CUDA kernel benchmark without torch (layers 2-3)" bash -c \
    "set -o pipefail; build/gpu/bench_cuda_kernels | tee '$RESULTS/bench_cuda_kernels_$STAMP.txt'"
fi
echo "== gpu_check done after $(( $(date +%s) - START )) s of a ${BUDGET_S} s budget, status $status; log: $LOG"
exit $status
