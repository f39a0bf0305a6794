#!/usr/bin/env python3
"""Static checks of the CUDA kernels as nvcc builds them: no GPU needed, run by tools/test.sh (issue 33).

Compiles csrc/cuda/{ring,twoshot,oneshot,alltoall,adam,reduce,quantize}.cu for sm_80 and sm_90a with the flags of the CMake
build (cmake/cuda.cmake, Release: -O3 -DNDEBUG -std=c++17 -I csrc; its -Xcompiler=-fPIC is for host code,
which -cubin does not compile), device code only, one job per file and arch in parallel, with `-Xptxas -v`;
disassembles the same cubins with `cuobjdump -sass`; prints per kernel instantiation and arch: registers,
stack frame, spill bytes, shared memory and the widths of its global loads and stores, then a summary per
kernel template (the table in benchmarks/RESULTS.md). The CMake build emits sm_90, the issue asked for
sm_90a: ptxas gives these kernels the same numbers for both (nothing here uses the sm_90a-only features).

A regression (exit 1, one line per finding naming the instantiation, the arch and what is wrong):
  - any spill, in a kernel or in the non-inlined helpers ptxas reports with it (give_up, stuck_culprit):
    a spilled register costs a local-memory round trip, and in the copy loops that is bandwidth lost;
  - a kernel built on reduce_span (one_shot_kernel, two_shot_kernel, ring_kernel, reduce_kernel) or on
    alltoall.cu's copy_elems (all_to_all_kernel, one instantiation per element size) without a 128-bit
    global load (LDG.E.128) or store (STG.E.128): its packs are 16 bytes for every dtype
    (__ldcg/__stcg of uint4 in device.cuh; ld.global.cg shows as LDG.E.128.STRONG.GPU);
  - adam_multi_kernel<P, G, M> without a Pack access of the width adam.cu writes: a Pack is kVec = 4
    elements, so 128 bits for a float32 operand and 64 bits for a 16-bit one; loads of P, G and M
    (exp_avg, exp_avg_sq, max_exp_avg_sq), stores of P and M. A combination with no float32 operand has
    no 128-bit access by design (widening it would mean 8 elements per thread).
Registers, stack frames and shared memory are recorded, not judged: they change with any edit, and the
launchers size their grids from the occupancy they give (dispatch.cuh, adam.cu). Stack frames are expected: Span's source array
is indexed at run time, and the StuckWait that a wait hands (by reference) to the non-inlined give_up is
built in local memory, so both live there.
  python3 tools/cuda_static_check.py [--arch 80,90a] [--root DIR] [-j N] [FILE.cu ...]
(--root: another checkout's csrc, e.g. a copy with a planted regression, to see the check fail.)
"""
import argparse
import collections
import concurrent.futures
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Slowest first, so that two cores finish together.
SOURCES = ["ring.cu", "twoshot.cu", "oneshot.cu", "alltoall.cu", "adam.cu", "reduce.cu", "quantize.cu"]
REDUCE_SPAN_KERNELS = ["one_shot_kernel", "two_shot_kernel", "ring_kernel", "reduce_kernel"]
PACK_KERNELS = REDUCE_SPAN_KERNELS + ["all_to_all_kernel"]  # 16-byte packs: 128-bit loads and stores
KERNELS = PACK_KERNELS + ["adam_multi_kernel", "sum_squares_multi_kernel", "quantize_kernel",
                                 "dequantize_kernel"]  # the table's order
ADAM_PACK_BITS = {"f32": 128, "bf16": 64, "f16": 64}  # kVec = 4 elements of each
SHORT_NAMES = {"float": "f32", "__nv_bfloat16": "bf16", "__half": "f16", "int": "int32", "long": "int64",
               "SumOp": "Sum", "ProdOp": "Prod", "MinOp": "Min", "MaxOp": "Max",
               "unsigned char": "u8", "unsigned short": "u16", "unsigned int": "u32", "unsigned long": "u64"}

Function = collections.namedtuple("Function", "regs stack spill_st spill_ld smem helper_st helper_ld helpers")


def find_tool(name):
    """`name` on PATH, beside the CUDA toolkit, or in a pip nvidia-cuda-* wheel (nvidia/cu13/bin)."""
    candidates = [shutil.which(name), f"/usr/local/cuda/bin/{name}"]
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidates += sorted(str(p) for p in Path(root).glob(f"*/bin/{name}"))
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def parse_ptxas(text):
    """{mangled kernel: Function} from `-Xptxas -v`. The non-inlined helpers a kernel calls are reported
    right after it ("Function properties for give_up..."); their spills are added to that kernel's."""
    found, entry, current = {}, None, None
    for line in text.splitlines():
        if m := re.search(r"Compiling entry function '(\S+)'", line):
            entry = m.group(1)
            found[entry] = {"regs": 0, "stack": 0, "spill_st": 0, "spill_ld": 0, "smem": 0,
                            "helper_st": 0, "helper_ld": 0, "helpers": []}
        elif m := re.search(r"Function properties for (\S+)", line):
            current = m.group(1)
        elif m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
            stack, st, ld = map(int, m.groups())
            if entry is None:  # a helper before any kernel: never seen; fail rather than drop it
                raise SystemExit(f"cuda_static_check: ptxas reported {current} before any kernel")
            if current == entry:
                found[entry].update(stack=stack, spill_st=st, spill_ld=ld)
            else:
                found[entry]["helper_st"] += st
                found[entry]["helper_ld"] += ld
                if st or ld:
                    found[entry]["helpers"].append(short_name(demangle([current])[0])[0])
        elif (m := re.search(r"Used (\d+) registers", line)) and entry == current:
            found[entry]["regs"] = int(m.group(1))
            if s := re.search(r"(\d+) bytes smem", line):
                found[entry]["smem"] = int(s.group(1))
    return {name: Function(**f) for name, f in found.items()}


def parse_sass(text):
    """{mangled kernel: (global load widths, global store widths)} in bits, from `cuobjdump -sass`."""
    widths, name = {}, None
    for line in text.splitlines():
        if m := re.search(r"Function : (\S+)", line):
            name = m.group(1)
            widths[name] = (set(), set())
        elif name and (m := re.search(r"\b(LDG|STG)\.E((?:\.\w+)*)", line)):
            mods = m.group(2).split(".")
            bits = next((int(x) for x in mods if x in ("64", "128")), None)
            bits = bits or next((int(x[1:]) for x in mods if x in ("U8", "S8", "U16", "S16")), 32)
            widths[name][0 if m.group(1) == "LDG" else 1].add(bits)
    return widths


def demangle(names):
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if not tool:
        return list(names)
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def short_name(demangled):
    """'void ringzero::cuda::(anonymous namespace)::ring_kernel<long, ringzero::cuda::SumOp>(...)' ->
    ('ring_kernel', ['int64', 'Sum'])."""
    plain = demangled.replace("(anonymous namespace)::", "")
    m = re.match(r"(?:void )?([^<(]+)(?:<([^()]*)>)?\(", plain)
    if not m:
        return plain, []
    strip = lambda text: re.sub(r"\w+::", "", text).strip()
    args = [SHORT_NAMES.get(strip(a), strip(a)) for a in (m.group(2) or "").split(",") if a.strip()]
    return strip(m.group(1)), args


def expected_widths(template, args):
    """(load widths, store widths) in bits that the code is written to use, as the header explains."""
    if template in PACK_KERNELS:
        return {128}, {128}
    if template == "adam_multi_kernel":
        p, g, m = (ADAM_PACK_BITS[a] for a in args)
        return {p, g, m}, {p, m}
    return set(), set()


def build(src, arch, out_dir, opts, nvcc, cuobjdump):
    """Compiles one file for one arch; returns (ptxas text, sass text)."""
    cubin = out_dir / f"{src.stem}.sm_{arch}.cubin"
    cmd = [nvcc, "-O3", "-DNDEBUG", "-std=c++17", f"-I{opts.root / 'csrc'}", f"-arch=sm_{arch}", "-cubin",
           "-Xptxas", "-v", str(src), "-o", str(cubin)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"cuda_static_check: nvcc failed on {src.name} for sm_{arch}:\n{done.stdout}{done.stderr}")
    env = dict(os.environ, PATH=f"{Path(cuobjdump).parent}{os.pathsep}{os.environ.get('PATH', '')}")  # nvdisasm
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True, env=env)
    return done.stdout + done.stderr, sass.stdout


Row = collections.namedtuple("Row", "arch template name fn loads stores need_loads need_stores problems")


def check(arch, ptxas, sass):
    """One Row per kernel of one compiled file; `problems` lists what fails the check."""
    functions, widths = parse_ptxas(ptxas), parse_sass(sass)
    rows = []
    for mangled, pretty in zip(functions, demangle(list(functions))):
        f, (loads, stores) = functions[mangled], widths.get(mangled, (set(), set()))
        template, args = short_name(pretty)
        need_loads, need_stores = expected_widths(template, args)
        problems = []
        if f.spill_st or f.spill_ld:
            problems.append(f"spills {f.spill_st} B stored / {f.spill_ld} B loaded")
        if f.helper_st or f.helper_ld:
            problems.append(f"its helper {'/'.join(f.helpers)} spills {f.helper_st} B stored / {f.helper_ld} B loaded")
        problems += [f"no {b}-bit global load (LDG.E.{b})" for b in sorted(need_loads - loads, reverse=True)]
        problems += [f"no {b}-bit global store (STG.E.{b})" for b in sorted(need_stores - stores, reverse=True)]
        name = f"{template}<{','.join(args)}>" if args else template
        rows.append(Row(arch, template, name, f, loads, stores, need_loads, need_stores, problems))
    return rows


def spill_bytes(f):
    return f.spill_st + f.spill_ld + f.helper_st + f.helper_ld


def fmt_range(values):
    return f"{min(values)}" if min(values) == max(values) else f"{min(values)}-{max(values)}"


def print_rows(rows):
    bits = lambda widths: ",".join(str(b) for b in sorted(widths, reverse=True)) or "-"
    print(f"{'arch':7} {'kernel':40} {'regs':>4} {'stack':>5} {'spill st/ld':>11} {'helper st/ld':>12} "
          f"{'smem':>5}  {'LDG bits':14} {'STG bits':14} check")
    for r in rows:
        f = r.fn
        print(f"sm_{r.arch:4} {r.name:40} {f.regs:4} {f.stack:5} {f'{f.spill_st}/{f.spill_ld}':>11} "
              f"{f'{f.helper_st}/{f.helper_ld}':>12} {f.smem:5}  {bits(r.loads):14} {bits(r.stores):14} "
              f"{'FAIL' if r.problems else 'ok'}")


def print_summary(rows):
    """One markdown line per kernel template and arch (the table of benchmarks/RESULTS.md)."""
    print("| kernel template | arch | instantiations | registers | stack frame B | spill B (stores + loads, "
          "kernel + helpers) | smem B | 128-bit loads / stores |")
    print("|---|---|---|---|---|---|---|---|")
    groups = collections.defaultdict(list)
    for r in rows:
        groups[(r.template, r.arch)].append(r)
    for (template, arch), group in groups.items():
        fns = [r.fn for r in group]
        spilled = [spill_bytes(f) for f in fns if spill_bytes(f)]
        spill = f"{len(spilled)} of {len(group)} spill, up to {max(spilled)}" if spilled else "0"
        wide = [r for r in group if 128 in r.need_loads | r.need_stores]
        missing = sum(1 for r in wide if (128 in r.need_loads - r.loads) or (128 in r.need_stores - r.stores))
        if not wide:
            access = "not required"
        elif len(wide) == len(group):
            access = f"missing in {missing} of {len(wide)}" if missing else "yes"
        else:  # adam: only the combinations with a float32 operand are written for 128 bits
            narrow = [r for r in group if r not in wide]
            narrow_missing = sum(1 for r in narrow if (r.need_loads - r.loads) or (r.need_stores - r.stores))
            access = (f"{f'missing in {missing} of' if missing else 'yes in'} the {len(wide)} with a float32 "
                      f"operand; the other {len(narrow)} (all 16-bit): "
                      + (f"64-bit missing in {narrow_missing}" if narrow_missing else "64-bit, as written"))
        print(f"| {template} | sm_{arch} | {len(group)} | {fmt_range([f.regs for f in fns])} | "
              f"{fmt_range([f.stack for f in fns])} | {spill} | {max(f.smem for f in fns)} | {access} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", default=SOURCES, help="files of csrc/cuda (default: every kernel file)")
    ap.add_argument("--arch", default="80,90a", help="comma-separated sm_ numbers (default 80,90a)")
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="repository root whose csrc/ is compiled (default: this checkout)")
    ap.add_argument("-j", "--jobs", type=int, default=int(os.environ.get("MAX_JOBS") or os.cpu_count() or 2))
    opts = ap.parse_args()
    nvcc, cuobjdump = find_tool("nvcc"), find_tool("cuobjdump")
    if not nvcc or not cuobjdump:
        sys.exit("cuda_static_check: needs nvcc and cuobjdump (tools/setup.sh installs nvidia-cuda-cuobjdump "
                 "and nvidia-cuda-nvdisasm where nvcc is present)")
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(opts.jobs) as pool:
        jobs = [(arch, pool.submit(build, opts.root / "csrc/cuda" / f, arch, Path(tmp), opts, nvcc, cuobjdump))
                for f in opts.files for arch in opts.arch.split(",")]
        rows = [row for arch, job in jobs for row in check(arch, *job.result())]
    rows.sort(key=lambda r: (KERNELS.index(r.template) if r.template in KERNELS else len(KERNELS), r.template,
                             r.arch, r.name))
    print_rows(rows)
    print("\nPer kernel template (markdown, for benchmarks/RESULTS.md):\n")
    print_summary(rows)
    print(f"\n{len(rows)} kernel instantiations checked in {time.monotonic() - start:.0f} s")
    failures = [f"FAIL {r.name} sm_{r.arch}: {p}" for r in rows for p in r.problems]
    if failures:
        print("\n".join(failures), file=sys.stderr)
        sys.exit(f"cuda_static_check: {len(failures)} finding(s) above; see the header of tools/cuda_static_check.py")


if __name__ == "__main__":
    main()
