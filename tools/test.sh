#!/usr/bin/env bash
# The test command (README, .ci/run): sets up, builds the C++ core with its tests (and every .cu file
# with nvcc when nvcc is present) and the CUDA kernels on the CPU grid, runs ctest, the CPU grid again
# under ThreadSanitizer, the static checks of the kernels' GPU code (with nvcc), compiles csrc/torch
# against torch 2.10 and 2.15 headers, builds the CUDA path against a CUDA torch (with nvcc:
# tools/cuda_torch_build.sh), then runs the Python tests. One phase after another: the compile-only
# checks once ran in the background while pytest ran (6a76ed7), and pytest took 2105 s instead of
# 1517 s, the whole run no shorter, and a race in a mismatch check showed only under that load.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's time, so that the whole run's (CI's limit 90 minutes, our target under 45) can be kept.
PHASE_START=$SECONDS
phase() { echo "[tools/test.sh] $1: $((SECONDS - PHASE_START)) s (total $((SECONDS / 60)) min $((SECONDS % 60)) s)"; PHASE_START=$SECONDS; }
bash tools/setup.sh
phase "setup and the editable build"
PY=${PYTHON:-python3}
NCCL_ROOT=$("$PY" -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
# The .cu files here for sm_80 alone (unless TORCH_CUDA_ARCH_LIST says otherwise): this build only
# compiles them (no GPU); the static checks below compile the kernels for sm_80 and sm_90a, and the CUDA
# build against a CUDA torch builds everything for sm_90a.
TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-8.0} \
  cmake -S . -B build/cpp -G Ninja -DCMAKE_BUILD_TYPE=Release ${NCCL_ROOT:+-DRINGZERO_NCCL_ROOT=$NCCL_ROOT}
cmake --build build/cpp -j "${MAX_JOBS:-2}"
phase "C++ core, its tests and the CPU grid built"
# Two at a time: the CPU grid's longest test keeps about 1.5 cores busy (2:51 -> 2:25 on the Intel 2-core VM,
# back to back; in CI runs the phase took 2:54 serial and 3:01 two at a time, hours apart).
ctest --test-dir build/cpp -j 2 --output-on-failure
phase "ctest"
# The CPU grid under ThreadSanitizer (its own build, CPU-grid tests only): the races and memory orderings
# of the kernels that synchronise (one-shot, two-shot, ring: the fuzz; the missing-rank path; Adam; the
# quantization's block reduction: every 7th case, 28 s; the all-to-all's fuzz),
# with chaos (random yields and stalls at every sync point; the fuzz prints its seed). Blocks of 64
# threads: TSan counts each CUDA thread as a thread and allows about 8000 at once. Left out: test_cuda
# (over 10 minutes under TSan: each of its thousands of launches makes a TSan thread per CUDA thread;
# its kernels are the fuzz's, plus the reduction kernel, which shares nothing between threads) and so
# the coverage check, which the plain run above makes. Two at a time: the fuzz is the longest test, the
# others fit beside it, but for the missing-rank test, which times its waits and runs alone (RUN_SERIAL,
# cmake/cpu_grid.cmake).
cmake -S . -B build/tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRINGZERO_CUDA=OFF \
  -DCMAKE_CXX_FLAGS=-fsanitize=thread -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread
cmake --build build/tsan -j "${MAX_JOBS:-2}" --target cpu_grid_tests
RINGZERO_CPU_GRID_THREADS=64 RINGZERO_CPU_GRID_CHAOS=${RINGZERO_CPU_GRID_CHAOS:-$RANDOM} \
  RINGZERO_FUZZ_CASES=${RINGZERO_TSAN_FUZZ_CASES:-60} RINGZERO_QUANT_CASE_STRIDE=7 TSAN_OPTIONS="halt_on_error=1 exitcode=66" \
  ctest --test-dir build/tsan -j 2 -L cpu_grid -E "^cpu_grid_(cuda|coverage)$" --output-on-failure
phase "the CPU grid under ThreadSanitizer, built and run"
# Static checks of the kernels' GPU code (no GPU needed): no spills, 128-bit packs (benchmarks/RESULTS.md).
if command -v nvcc >/dev/null 2>&1; then "$PY" tools/cuda_static_check.py; phase "static checks of the GPU code"; fi
# csrc/torch against the oldest and newest supported torch (headers only; the build above used the
# installed one). RINGZERO_COMPAT_TORCH="" skips it, or names other releases.
COMPAT_TORCH=${RINGZERO_COMPAT_TORCH-2.10.0 2.15.0}
CUDA_TORCH=0
if command -v nvcc >/dev/null 2>&1 && [ "${RINGZERO_CUDA_TORCH_BUILD:-1}" != 0 ]; then CUDA_TORCH=1; fi
if [ -n "$COMPAT_TORCH" ]; then bash tools/torch_compat.sh $COMPAT_TORCH; phase "csrc/torch against torch $COMPAT_TORCH"; fi
# A GPU user's install without a GPU, where nvcc is installed: the whole extension built and linked with
# nvcc against a CUDA torch in an environment of its own (downloads torch 2.13.0+cu130 and its nvidia
# wheels, about 3.5 GB, once per machine: kept in ~/.cache/ringzero), imported, and its no-GPU errors and
# CPU tests run there. RINGZERO_CUDA_TORCH_BUILD=0 skips it.
if [ $CUDA_TORCH = 1 ]; then bash tools/cuda_torch_build.sh; phase "the CUDA build against a CUDA torch"; fi
# --durations: the slowest tests, to keep the suite's time in view.
"$PY" -m pytest -q --durations=25 tests "$@"
phase "pytest"
