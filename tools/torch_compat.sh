#!/usr/bin/env bash
# Compiles every file of csrc/torch/ (-fsyntax-only) against the headers of other torch releases, CPU and
# CUDA variants, each with the C++ standard that release requires (cmake/torch_cxx_standard.cmake: the
# same rule the real build uses). Catches an API difference without installing that torch.
# Each variant is one translation unit that includes every file (torch's headers parsed once: 25 s, where
# a file alone takes 17-20 s, 13 of them); only where it fails are the files compiled one by one, to name
# the one at fault. What a single unit cannot see: a file that lacks an include another file supplies. The
# real build compiles each file alone against the installed torch, which catches that for it.
#   bash tools/torch_compat.sh 2.10.0 2.15.0        # any versions; CI runs the oldest and newest supported
# Each wheel is downloaded once (pip download --no-deps, 0.5-0.9 GB, CUDA build: it has the c10/cuda
# headers) into RINGZERO_TORCH_CACHE (default ~/.cache/ringzero/torch), only its headers are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
CACHE=${RINGZERO_TORCH_CACHE:-$HOME/.cache/ringzero/torch}
JOBS=${MAX_JOBS:-2}
CXX=${CXX:-g++}
[ $# -ge 1 ] || { echo "usage: $0 VERSION... (e.g. 2.10.0 2.15.0)" >&2; exit 2; }

# CUDA headers for the -DRINGZERO_WITH_CUDA variant: the toolkit next to nvcc, else CUDA_HOME.
CUDA_INC=""
for d in "${CUDA_HOME:-}" "$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")")" /usr/local/cuda; do
  if [ -n "$d" ] && [ -f "$d/include/cuda_runtime.h" ]; then CUDA_INC="$d/include"; break; fi
done
[ -n "$CUDA_INC" ] || { echo "torch_compat: no cuda_runtime.h found (set CUDA_HOME); the CUDA variant needs it" >&2; exit 1; }
NCCL_INC=$("$PY" -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'include'))" 2>/dev/null || true)
PY_INC=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")

fetch_headers() {  # $1 = version; prints the folder holding torch/include
  local v=$1 dir="$CACHE/$1"
  if [ ! -f "$dir/torch/include/ATen/ATen.h" ]; then
    local tmp
    tmp=$(mktemp -d)
    # PIP_CONFIG_FILE=/dev/null: this machine's pip configuration caps torch below the newest release.
    PIP_CONFIG_FILE=/dev/null "$PY" -m pip download -q --no-deps --only-binary=:all: "torch==$v" -d "$tmp" >&2
    rm -rf "$dir.part" && mkdir -p "$dir.part"
    (cd "$dir.part" && unzip -q "$tmp"/torch-*.whl 'torch/include/*' 'torch/version.py')
    rm -rf "$tmp" "$dir" && mv "$dir.part" "$dir"
  fi
  echo "$dir"
}

# The files that change under RINGZERO_WITH_CUDA get a second, CUDA compile; the others preprocess the same.
FILES=(csrc/torch/*.cpp)
CUDA_FILES=()
for f in "${FILES[@]}"; do if grep -q RINGZERO_WITH_CUDA "$f"; then CUDA_FILES+=("$f"); fi; done
UNITS=$(mktemp -d)
trap 'rm -rf "$UNITS"' EXIT
status=0
for v in "$@"; do
  dir=$(fetch_headers "$v")
  inc="$dir/torch/include"
  std=$(cmake -DTORCH_INCLUDE_DIR="$inc" -P cmake/torch_cxx_standard.cmake 2>&1)
  echo "== torch $v ($(sed -n "s/^__version__ = '\(.*\)'/\1/p" "$dir/torch/version.py")): C++$std"
  log="$CACHE/compat-$v.log"
  : >"$log"
  # One unit per variant, both at once; a unit's failure is then narrowed down file by file.
  for variant in cpu cuda; do
    if [ $variant = cpu ]; then files=("${FILES[@]}"); else files=("${CUDA_FILES[@]}"); fi
    for f in "${files[@]}"; do echo "#include \"$ROOT/$f\""; done >"$UNITS/$v-$variant.cpp"
    echo "$variant ${files[*]}" >"$UNITS/$v-$variant.files"
  done
  printf '%s\n' cpu cuda | xargs -P "$JOBS" -L 1 bash -c '
    variant=$1 unit='"$UNITS/$v"'-$1
    flags=(-std=c++'"$std"' -fsyntax-only -w -I '"$ROOT"'/csrc -I '"$inc"' -I '"$inc"'/torch/csrc/api/include -I '"$PY_INC"')
    if [ "$variant" = cuda ]; then flags+=(-DRINGZERO_WITH_CUDA=1 -I '"$CUDA_INC"' ${0:+-I $0}); fi
    if '"$CXX"' "${flags[@]}" "$unit.cpp" >"$unit.out" 2>&1; then
      for f in $(cut -d" " -f2- "$unit.files"); do echo "ok    $variant $f"; done
      exit 0
    fi
    for f in $(cut -d" " -f2- "$unit.files"); do
      if out=$('"$CXX"' "${flags[@]}" "$f" 2>&1); then echo "ok    $variant $f"
      else echo "FAIL  $variant $f"; echo "$out" | grep -m 8 "error" | sed "s/^/      /"; fi
    done
    echo "FAIL  $variant (the unit of all files):"; grep -m 8 "error" "$unit.out" | sed "s/^/      /"
    exit 1
  ' "$NCCL_INC" | tee -a "$log" || status=1
done
if [ $status = 0 ]; then echo "torch_compat: every file of csrc/torch compiles against torch $*"
else echo "torch_compat: FAILED (details above)"; fi
exit $status
