"""Small-message latency on one host through two doors, this checkout against another build of ringzero
(issue 43's "no step back on one host"): a blocking float32 all-reduce of --kib KiB at 2 ranks, through
`dist.all_reduce` on a group of the swap-in backend (init_process_group("ringzero")) and through
`ringzero.all_reduce` on the same group.

    python benchmarks/one_host_latency.py --other /path/to/other/python [--pairs 6]

--other is the python/ folder of the other build (its ringzero._C built in place). Each process times
--calls calls per block after --warmup calls, 7 blocks, and reports rank 0's median block in us per
call; processes of the two builds alternate, the order flipped each pair, so that the machine's load
falls on both alike. Prints each pair and the medians, and the ratio this / other (below 1: faster).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
THIS = os.path.join(os.path.dirname(HERE), "python")
DOORS = ("dist.all_reduce", "ringzero.all_reduce")


def rank(rank_: int, world: int, store: str, kib: float, calls: int, warmup: int, out: str):
    import torch
    import torch.distributed as dist

    import ringzero

    dist.init_process_group("ringzero", store=dist.FileStore(store, world), rank=rank_, world_size=world)
    x = torch.ones(int(kib * 1024) // 4)
    fns = {"dist.all_reduce": lambda: dist.all_reduce(x), "ringzero.all_reduce": lambda: ringzero.all_reduce(x)}
    result = {}
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
        blocks = []
        for _ in range(7):
            dist.barrier()
            t0 = __import__("time").perf_counter()
            for _ in range(calls):
                fn()
            blocks.append((__import__("time").perf_counter() - t0) / calls * 1e6)
        result[name] = statistics.median(blocks)
    if rank_ == 0:
        with open(out, "w") as f:
            json.dump({**result, "native": ringzero.backend_stats()["native"].get("allreduce", 0)}, f)
    dist.destroy_process_group()


def one_run(python_dir: str, args) -> dict:
    """Two ranks of the build in python_dir; rank 0's medians."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        env = {**os.environ, "PYTHONPATH": python_dir}
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", str(r), "--store",
                                   os.path.join(tmp, "store"), "--out", out, "--kib", str(args.kib), "--calls",
                                   str(args.calls), "--warmup", str(args.warmup)], env=env) for r in range(2)]
        if any(p.wait(timeout=600) != 0 for p in procs):
            raise SystemExit(f"a rank of the build in {python_dir} failed")
        with open(out) as f:
            return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--other", help="the python/ folder of the build to compare with")
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--kib", type=float, default=4)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--warmup", type=int, default=3000)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank is not None:
        return rank(args.rank, 2, args.store, args.kib, args.calls, args.warmup, args.out)
    if not args.other:
        p.error("--other is required: the python/ folder of the build to compare with")
    runs = {"this": [], "other": []}
    print(f"# one_host_latency | 2 ranks | float32 all-reduce of {args.kib:g} KiB, blocking | us per call, "
          f"rank 0's median of 7 blocks of {args.calls} | load average {os.getloadavg()[0]:.2f}")
    for i in range(args.pairs):
        order = [("this", THIS), ("other", args.other)][:: 1 if i % 2 == 0 else -1]
        for name, path in order:
            r = one_run(path, args)
            runs[name].append(r)
            print(f"pair {i}: {name:<5} " + " | ".join(f"{d} {r[d]:7.2f}" for d in DOORS) + f" | native {r['native']}")
    print(f"\n{'door':<20} | {'this us':>8} | {'other us':>8} | this/other")
    for d in DOORS:
        a, b = statistics.median(r[d] for r in runs["this"]), statistics.median(r[d] for r in runs["other"])
        print(f"{d:<20} | {a:8.2f} | {b:8.2f} | {a / b:.3f}")


if __name__ == "__main__":
    main()
