#!/usr/bin/env python3
"""Which CUDA kernels the CPU-grid tests ran, against the kernels in the source.

Reads the kernel logs the CPU-grid test programs write (RINGZERO_CPU_GRID_KERNEL_LOG: one
"count<TAB>full name" line per kernel instantiation launched), lists every `__global__` kernel of
csrc/cuda/*.cu with the instantiations that ran, and fails when a kernel of the source never ran, or
ran with fewer instantiations than its launcher can dispatch (collectives and the reduction: 5 dtypes
x 4 operators, Avg sharing Sum's kernel; Adam: 3 parameter x 3 gradient x 2 moment dtypes).

    python3 tools/cpu_grid_coverage.py --src csrc/cuda build/cpp/cpu_grid_kernels_*.txt
"""
import argparse
import collections
import pathlib
import re
import sys

GLOBAL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(")
# Instantiations the launchers dispatch (dispatch.cuh, adam.cu's by_moment/by_grad/launch_table).
EXPECTED = {
    "one_shot_kernel": 20,
    "two_shot_kernel": 20,
    "ring_kernel": 20,
    "reduce_kernel": 20,
    "adam_multi_kernel": 18,
    "sum_squares_multi_kernel": 1,
    "quantize_kernel": 2,  # 8 and 4 bits
    "dequantize_kernel": 2,
    "all_to_all_kernel": 4,  # elements of 1, 2, 4 and 8 bytes
}


def kernels_in_source(src):
    found = {}
    for path in sorted(pathlib.Path(src).glob("*.cu")):
        for name in GLOBAL.findall(path.read_text()):
            found[name] = path.name
    return found


def base_name(full):
    """ringzero::cuda::one_shot_kernel<float, ringzero::cuda::SumOp> -> one_shot_kernel"""
    return full.split("<", 1)[0].rsplit("::", 1)[-1].strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default="csrc/cuda")
    ap.add_argument("logs", nargs="+")
    args = ap.parse_args()
    ran = collections.defaultdict(dict)  # base name -> {instantiation: launches}
    for log in args.logs:
        path = pathlib.Path(log)
        if not path.exists():
            print(f"cpu_grid_coverage: no log {log} (did its test run?)")
            return 1
        for line in path.read_text().splitlines():
            count, full = line.split("\t", 1)
            ran[base_name(full)][full] = ran[base_name(full)].get(full, 0) + int(count)
    source = kernels_in_source(args.src)
    failures = []
    print(f"{'kernel':28} {'file':12} {'instantiations run':>20} {'launches':>10}")
    for name, file in sorted(source.items()):
        inst = ran.get(name, {})
        want = EXPECTED.get(name)
        print(f"{name:28} {file:12} {len(inst):>12} of {want if want else '?':<5} {sum(inst.values()):>10}")
        if not inst:
            failures.append(f"{name} ({file}) never ran on the CPU grid")
        elif want is None:
            failures.append(f"{name} ({file}) is new: add its dispatched instantiations to EXPECTED here")
        elif len(inst) < want:
            failures.append(f"{name}: {len(inst)} of {want} instantiations ran")
    for name in sorted(set(ran) - set(source)):
        print(f"(ran, not a __global__ in {args.src}: {name})")
    for f in failures:
        print("cpu_grid_coverage: FAIL", f)
    if not failures:
        print(f"cpu_grid_coverage: every kernel of {args.src} ran ({len(source)} kernels)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
