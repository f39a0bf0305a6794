"""Large-message collectives under different settings, labelled by where the host ran the cores.

    python benchmarks/slot_sweep.py --rounds 10 RINGZERO_SHM_BUFFER_BYTES=262144 RINGZERO_SHM_BUFFER_BYTES=1048576

Each positional argument is one setting (NAME=VALUE[,NAME=VALUE...] of environment variables, or `default`).
Every round runs one fresh 2-rank job per setting, in turn; each job times all_reduce, all_gather and
reduce_scatter at --sizes with ringzero.timing.time_calls (as `ringzero bench` and mpi_anchor.py do). The
driver measures the cache-line round trip between the first two cpus before and after each job
(ringzero._C.core_round_trip_ns) and files the job under "one" (one L3 both times), "split" (two L3s both
times) or drops it (it changed). Prints the median ms per setting and placement: the measurement behind
the 256 KiB slot default (comm/config.py) and [Note: where the host runs the ranks' cores].
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.abspath(__file__)


def worker(args):
    import torch
    import torch.distributed as dist

    import ringzero
    from ringzero.cli.bench import _timed

    world = dist.get_world_size()
    out = {}
    for size in args.sizes:
        n = size // 4
        x, big, small = torch.ones(n), torch.ones(n), torch.ones(n // world)
        calls = {"all_reduce": lambda: ringzero.all_reduce(x), "all_gather": lambda: ringzero.all_gather_single(big, small),
                 "reduce_scatter": lambda: ringzero.reduce_scatter_single(small, big)}
        for op, call in calls.items():
            out[f"{op} {size >> 20}M"] = _timed(call, args.budget_s, ringzero.barrier) * 1e3
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(out), flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("settings", nargs="*")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--sizes", default="1,16,64", help="MiB, comma-separated")
    p.add_argument("--budget-s", type=float, default=0.15)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.sizes = [int(s) << 20 for s in args.sizes.split(",")]
    if args.worker:
        from ringzero.cli.launch import launch

        return launch(worker, 2, args)
    from ringzero.cli.bench import core_round_trip_ns, placement_of

    if not args.settings:
        p.error("name at least one setting (or `default`)")
    if len(os.sched_getaffinity(0)) < 2:
        p.error("needs two cpus")
    jobs = {s: {"one": [], "split": []} for s in args.settings}
    for r in range(args.rounds):
        for setting in args.settings:
            env = dict(os.environ)
            if setting != "default":
                env.update(kv.split("=", 1) for kv in setting.split(","))
            before = core_round_trip_ns()
            run = subprocess.run([sys.executable, HERE, "--worker", "--sizes", ",".join(str(s >> 20) for s in args.sizes),
                                  "--budget-s", str(args.budget_s)], env=env, capture_output=True, text=True)
            after = core_round_trip_ns()
            line = next((ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if run.returncode != 0 or line is None:
                raise SystemExit(f"job {setting} failed:\n{run.stderr[-3000:]}")
            where = placement_of([before, after])
            if where != "mixed":
                jobs[setting][where].append(json.loads(line[7:]))
            print(f"# round {r + 1} {setting}: round trip {before:.0f}/{after:.0f} ns -> {where if where != 'mixed' else 'changed, dropped'}",
                  flush=True)
    for where in ("one", "split"):
        print(f"\n## cores on {'one L3' if where == 'one' else 'two L3s'}: median ms (jobs)")
        for setting, got in jobs.items():
            rs = got[where]
            if rs:
                print(f"{setting} ({len(rs)}): " + "  ".join(f"{k} {statistics.median(r[k] for r in rs):.2f}" for k in rs[0]))


if __name__ == "__main__":
    main()
