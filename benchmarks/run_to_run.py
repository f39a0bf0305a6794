"""Why one run of a collective is slower than another: whole jobs back to back, each call timed, and beside
every row what else happened on the machine while it ran.

    python benchmarks/run_to_run.py                           # 5 jobs of 2 ranks under torchrun
    python benchmarks/run_to_run.py --jobs 8 --launcher ringzero --out benchmarks/results/run-to-run-DATE

Each job is a fresh torchrun (or ringzero launcher) of --nproc ranks that times every op at every size as
`ringzero bench` does (warm up, then --budget-s of calls between two barriers), but call by call, and
records for the timed loop of each row:
  - the mean, median and slowest call, and how many calls took over 2x the median (the outliers);
  - steal: cpu time the hypervisor gave to other guests while this VM wanted it (/proc/stat, all cpus);
  - others: cpu time spent on this machine by processes other than the job's ranks (/proc/stat busy time
    minus the ranks' own);
  - the ranks' involuntary context switches (the kernel took the cpu away mid-call: a rank descheduled)
    and minor page faults (fresh pages touched).
The table sets each row's slowest job against its fastest with those counters, so a slow job can be told
apart: the host (steal), a neighbour (others, involuntary switches), or ringzero itself (none of these).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
OPS = ("all_reduce", "reduce_scatter", "all_gather")
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_ticks() -> tuple[int, int]:
    """(busy, steal) jiffies of all cpus together since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in f.readline().split()[1:9])
    return user + nice + system + irq + softirq, steal


def _time_row(call, sync, budget_s: float):
    """Per-call seconds of a loop that fills budget_s (the same count on every rank), with the counters."""
    import torch
    import torch.distributed as dist

    call()
    sync()
    t0 = time.perf_counter()
    call()
    one = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(one, op=dist.ReduceOp.MAX)
    iters = int(min(20_000, max(3, budget_s / max(one.item(), 1e-7))))
    times = [0.0] * iters
    sync()
    use0, (busy0, steal0) = resource.getrusage(resource.RUSAGE_SELF), cpu_ticks()
    for i in range(iters):
        t0 = time.perf_counter()
        call()
        times[i] = time.perf_counter() - t0
    use1, (busy1, steal1) = resource.getrusage(resource.RUSAGE_SELF), cpu_ticks()
    own_s = (use1.ru_utime + use1.ru_stime) - (use0.ru_utime + use0.ru_stime)
    return {"times": times, "busy_s": (busy1 - busy0) * TICK_S, "steal_s": (steal1 - steal0) * TICK_S,
            "own_s": own_s, "nivcsw": use1.ru_nivcsw - use0.ru_nivcsw, "minflt": use1.ru_minflt - use0.ru_minflt}


def worker(args):
    import torch
    import torch.distributed as dist

    import ringzero
    from ringzero.cli.bench import _calls

    rank, world = dist.get_rank(), dist.get_world_size()
    rows = {}
    for op in args.ops:
        for size in args.sizes:
            _, ours, _, _ = _calls(op, size, torch.float32, world, rank)
            rows[f"{op} {size}"] = _time_row(ours, ringzero.barrier, args.budget_s)
    every = [None] * world
    dist.all_gather_object(every, {"cpus": sorted(os.sched_getaffinity(0)), "rows": rows})
    if rank == 0:
        with open(args.result, "w") as f:
            json.dump(every, f)


def summarise(ranks: list) -> dict:
    """One job's rows: the slowest rank's mean call (as the benchmarks count), its median and slowest call,
    outliers over 2x the median, and the counters summed over the ranks (steal and busy are machine-wide,
    so taken once; others = busy minus the ranks' own cpu time)."""
    out = {}
    for key in ranks[0]["rows"]:
        rows = [r["rows"][key] for r in ranks]
        worst = max(rows, key=lambda row: statistics.fmean(row["times"]))
        med = statistics.median(worst["times"])
        out[key] = {"mean_us": statistics.fmean(worst["times"]) * 1e6, "median_us": med * 1e6,
                    "max_us": max(worst["times"]) * 1e6, "outliers": sum(t > 2 * med for t in worst["times"]),
                    "calls": len(worst["times"]), "steal_ms": max(r["steal_s"] for r in rows) * 1e3,
                    "others_ms": max(0.0, max(r["busy_s"] for r in rows) - sum(r["own_s"] for r in rows)) * 1e3,
                    "nivcsw": sum(r["nivcsw"] for r in rows), "minflt": sum(r["minflt"] for r in rows)}
    return out


def run_job(args, result: str) -> dict:
    common = ["--worker", "--ops", ",".join(args.ops), "--sizes", ",".join(map(str, args.sizes)),
              "--budget-s", str(args.budget_s), "--result", result]
    if args.launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
               HERE] + common
    else:
        cmd = [sys.executable, HERE, "--nproc", str(args.nproc)] + common
    from ringzero.cli.bench import core_round_trip_ns, placement_of

    before = core_round_trip_ns()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.job_timeout_s)
    if out.returncode != 0 or not os.path.exists(result):
        raise SystemExit(f"job failed (exit {out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    after = core_round_trip_ns()
    with open(result) as f:
        ranks = json.load(f)
    # Where the host ran the two cpus, before and after the job (one L3 or two: bench.SPLIT_CACHE_NS).
    trips = [ns for ns in (before, after) if ns is not None]
    return {"cpus": [r["cpus"] for r in ranks], "rows": summarise(ranks), "round_trip_ns": trips,
            "placement": placement_of(trips) if trips else "n/a"}


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or the machine type where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        import platform

        return platform.machine()


def table(jobs: list, args) -> str:
    """Markdown: per row, every job's mean call, slowest/median and slowest/fastest job, and the counters of
    the fastest and the slowest job. A slow mode (whole jobs several times slower) shows as a slowest/median
    far above 1; issue 47's bar is 1.3."""
    from ringzero.cli.bench import human

    lines = ["| op | size | mean us per job | slowest / median | slowest / fastest | fastest job: outliers, steal ms, "
             "others ms, invol. switches, minor faults | slowest job: the same |", "|---|---|---|---|---|---|---|"]
    for op in args.ops:
        for size in args.sizes:
            rows = [job["rows"][f"{op} {size}"] for job in jobs]
            fast, slow = min(rows, key=lambda r: r["mean_us"]), max(rows, key=lambda r: r["mean_us"])

            def counters(r):
                return (f"{r['outliers']}/{r['calls']}, {r['steal_ms']:.0f}, {r['others_ms']:.0f}, {r['nivcsw']}, "
                        f"{r['minflt']}")
            lines.append(f"| {op} | {human(size)} | " + " ".join(f"{r['mean_us']:.1f}" for r in rows) +
                         f" | {slow['mean_us'] / statistics.median(r['mean_us'] for r in rows):.2f}"
                         f" | {slow['mean_us'] / fast['mean_us']:.2f} | {counters(fast)} | {counters(slow)} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=5)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--launcher", choices=("torchrun", "ringzero"), default="torchrun")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--sizes", default="4K,64K,1M,16M,64M")
    p.add_argument("--budget-s", type=float, default=0.2)
    p.add_argument("--job-timeout-s", type=float, default=600)
    p.add_argument("--out", default="", help="write <out>.md (table) and <out>.json (every job)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from ringzero.cli.bench import parse_size

    args.ops = [o for o in args.ops.split(",") if o]
    if any(o not in OPS for o in args.ops):
        p.error(f"--ops: choose from {', '.join(OPS)}")
    args.sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    if args.worker:
        if "RANK" in os.environ:  # one rank of torchrun's
            from ringzero.cli.launch import run_as_user_script

            return run_as_user_script(worker, args)
        from ringzero.cli.launch import launch

        return launch(worker, args.nproc, args)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [run_job(args, os.path.join(tmp, f"job-{j}.json")) for j in range(args.jobs)]
    text = (f"# run_to_run | {time.strftime('%Y-%m-%d %H:%M')} | {cpu_model()} | {os.cpu_count()} cpus | {args.nproc} ranks by "
            f"{args.launcher} | {args.jobs} jobs | budget {args.budget_s} s per row | load before: {load}\n"
            f"# ranks' cpus per job: {'; '.join(str(job['cpus']) for job in jobs)}\n"
            f"# cores per job (one: both cpus on one L3 before and after; split: on two; mixed: it changed), round "
            f"trips ns: {'; '.join(job['placement'] + ' ' + '/'.join(f'{ns:.0f}' for ns in job['round_trip_ns']) for job in jobs)}"
            f"\n\n{table(jobs, args)}\n")
    print(text)
    if args.out:
        with open(args.out + ".md", "w") as f:
            f.write(text)
        with open(args.out + ".json", "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "result"}, "jobs": jobs}, f, indent=1)


if __name__ == "__main__":
    main()
