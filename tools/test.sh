#!/usr/bin/env bash
# The test command (README, .ci/run): sets up, builds the C++ core with its tests (and every .cu file
# with nvcc when nvcc is present), runs ctest, then the Python tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
PY=${PYTHON:-python3}
NCCL_ROOT=$("$PY" -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
cmake -S . -B build/cpp -G Ninja -DCMAKE_BUILD_TYPE=Release ${NCCL_ROOT:+-DRINGZERO_NCCL_ROOT=$NCCL_ROOT}
cmake --build build/cpp -j "${MAX_JOBS:-2}"
ctest --test-dir build/cpp --output-on-failure
"$PY" -m pytest -q tests "$@"
