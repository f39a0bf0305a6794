#!/usr/bin/env bash
# The test command (README, .ci/run): sets up, builds the C++ core with its tests (and every .cu file
# with nvcc when nvcc is present), runs ctest and the static checks of the kernels' GPU code (with nvcc),
# compiles csrc/torch against torch 2.10 and 2.15 headers, then runs the Python tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
PY=${PYTHON:-python3}
NCCL_ROOT=$("$PY" -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
cmake -S . -B build/cpp -G Ninja -DCMAKE_BUILD_TYPE=Release ${NCCL_ROOT:+-DRINGZERO_NCCL_ROOT=$NCCL_ROOT}
cmake --build build/cpp -j "${MAX_JOBS:-2}"
ctest --test-dir build/cpp --output-on-failure
# Static checks of the kernels' GPU code (no GPU needed): no spills, 128-bit packs (benchmarks/RESULTS.md).
if command -v nvcc >/dev/null 2>&1; then "$PY" tools/cuda_static_check.py; fi
# csrc/torch against the oldest and newest supported torch (headers only; the build above used the
# installed one). RINGZERO_COMPAT_TORCH="" skips it, or names other releases.
COMPAT_TORCH=${RINGZERO_COMPAT_TORCH-2.10.0 2.15.0}
if [ -n "$COMPAT_TORCH" ]; then bash tools/torch_compat.sh $COMPAT_TORCH; fi
"$PY" -m pytest -q tests "$@"
