"""Per-call latency distribution of ringzero's CPU collectives, optionally beside busy background loops:
the measurement behind [Note: waiting in the shared-memory collectives] (csrc/core/shm_wait.h).

    python benchmarks/latency_under_load.py --op all_reduce --sizes 4K,64K,1M,16M --background 1

Each rank times every call on its own (not a loop mean), so one slow call shows as a tail, and a slow
regime as a slow median. Columns: mean, p50, p90 and max of rank 0's per-call times in us, and rank 0's
involuntary (ivcsw: preempted, or a yield that switched) and voluntary (vcsw: slept) context switches
per call, from getrusage. --background N starts N `nice -n 19` busy loops for the run (a build or a
test beside the job); --nice0 makes them compete at normal priority instead.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

import torch
import torch.distributed as dist


def _worker(args):
    import ringzero

    rank, world = dist.get_rank(), dist.get_world_size()
    calls = {"all_reduce": lambda big, small: lambda: ringzero.all_reduce(big),
             "reduce_scatter": lambda big, small: lambda: ringzero.reduce_scatter_single(small, big),
             "all_gather": lambda big, small: lambda: ringzero.all_gather_single(big, small)}
    for size in args.sizes:
        n = max(world, size // 4)
        call = calls[args.op](torch.ones(n), torch.ones(n // world))
        for _ in range(20):
            call()
        ringzero.barrier()
        times = []
        before = resource.getrusage(resource.RUSAGE_SELF)
        for _ in range(args.iters):
            t0 = time.perf_counter_ns()
            call()
            times.append(time.perf_counter_ns() - t0)
        after = resource.getrusage(resource.RUSAGE_SELF)
        if rank == 0:
            times.sort()
            q = lambda p: times[int(p * (len(times) - 1))] / 1e3  # noqa: E731
            print(f"{args.op:>14} {size >> 10:>7}K | {sum(times) / len(times) / 1e3:>9.1f} {q(.5):>9.1f} {q(.9):>9.1f} "
                  f"{q(1):>10.1f} | {(after.ru_nivcsw - before.ru_nivcsw) / args.iters:>6.2f} "
                  f"{(after.ru_nvcsw - before.ru_nvcsw) / args.iters:>6.2f}", flush=True)


def main(argv=None):
    from ringzero.cli.bench import parse_size
    from ringzero.cli.launch import launch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", default="all_reduce", choices=("all_reduce", "reduce_scatter", "all_gather"))
    p.add_argument("--sizes", default="4K,64K,1M,16M")
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--background", type=int, default=0, help="busy loops to run beside the ranks")
    p.add_argument("--nice0", action="store_true", help="background loops at nice 0 instead of 19")
    args = p.parse_args(argv)
    args.sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    loops = [subprocess.Popen(([] if args.nice0 else ["nice", "-n", "19"]) + [sys.executable, "-c", "while True: pass"])
             for _ in range(args.background)]
    try:
        print(f"# {args.nproc} ranks, {args.background} background loop(s) at nice {0 if args.nice0 else 19}, "
              f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"{'op':>14} {'size':>8} | {'mean':>9} {'p50':>9} {'p90':>9} {'max':>10} | {'ivcsw':>6} {'vcsw':>6}")
        launch(_worker, args.nproc, args)
    finally:
        for loop in loops:
            loop.kill()


if __name__ == "__main__":
    main()
