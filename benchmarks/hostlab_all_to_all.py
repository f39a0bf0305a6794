"""All-to-all across the lab's hosts (tests/helpers/hostlab.py: network namespaces on a bridge, each link
shaped with tbf): ringzero through both doors against gloo's own call, beside the link bound.

Each rank's input of SIZE MiB (float32) goes out in world equal blocks. Three ways, taking turns in each
repeat: `ringzero.all_to_all_single` on the default gloo group (the ringzero door: hierarchical where every
host has the same number of ranks), `dist.all_to_all_single` on a group made with backend="ringzero" (the
backend door: the same engine), and `dist.all_to_all_single` on the gloo group (the baseline). Every
output is checked equal to gloo's first. The link bound: each host's link must carry, each way, its ranks'
blocks for the other hosts, L ranks x (H-1)/H x SIZE, over the rate. Gather and scatter (SIZE per rank,
root 0) are timed the same way; their bound is the root host's link: (H-1) x L x SIZE over the rate.

Run as root: nice -n 19 python benchmarks/hostlab_all_to_all.py [--rate-gbit 1] [--sizes-mib 16]
[--hosts 2] [--ranks-per-host 2] [--repeats 5]. The per-rank part (--rank) is what torchrun starts on each
host.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "helpers"))


def rank_main(out: str, sizes_mib: list[float], repeats: int):
    import torch
    import torch.distributed as dist

    import ringzero

    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    rz = dist.new_group(list(range(world)), backend="ringzero")
    rows = []
    for mib in sizes_mib:
        numel = int(mib * (1 << 20)) // 4 // world * world
        x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
        outs = {k: torch.empty(numel) for k in ("ringzero.*", "backend", "gloo")}
        ways = {"ringzero.*": lambda: ringzero.all_to_all_single(outs["ringzero.*"], x),
                "backend": lambda: dist.all_to_all_single(outs["backend"], x, group=rz),
                "gloo": lambda: dist.all_to_all_single(outs["gloo"], x)}
        gathered = [torch.empty(numel) for _ in range(world)] if rank == 0 else None
        mine = torch.empty(numel)
        ways_gs = {"gather ringzero.*": lambda: ringzero.gather(x, gathered, dst=0),
                   "gather backend": lambda: dist.gather(x, gathered, dst=0, group=rz),
                   "gather gloo": lambda: dist.gather(x, gathered, dst=0),
                   "scatter ringzero.*": lambda: ringzero.scatter(mine, gathered, src=0),
                   "scatter backend": lambda: dist.scatter(mine, gathered, src=0, group=rz),
                   "scatter gloo": lambda: dist.scatter(mine, gathered, src=0)}
        for fn in ways.values():
            fn()
        for k in ("ringzero.*", "backend"):
            if not torch.equal(outs[k], outs["gloo"]):
                raise SystemExit(f"rank {rank}: {k} differs from gloo at {mib} MiB")
        times = {k: [] for k in [*ways, *ways_gs]}
        for _ in range(repeats):
            for k, fn in [*ways.items(), *ways_gs.items()]:
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                times[k].append(t.item() * 1e3)
        rows.append({"mib": mib, "bytes": numel * 4, "ms": {k: statistics.median(v) for k, v in times.items()},
                     "range": {k: [min(v), max(v)] for k, v in times.items()}, "load": os.getloadavg()[0]})
    if rank == 0:
        comm = ringzero.get_communicator(dist.group.WORLD)
        stats = ringzero.backend_stats(rz)
        with open(os.path.join(out, "bench.json"), "w") as f:
            json.dump({"rows": rows, "transport": type(comm.transport).__name__, "stats": stats}, f)
    ringzero.destroy_communicators()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate-gbit", type=float, default=1.0)
    p.add_argument("--sizes-mib", type=float, nargs="+", default=[16])
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--ranks-per-host", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rank", metavar="OUT", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank:
        return rank_main(args.rank, args.sizes_mib, args.repeats)
    import hostlab

    H, L = args.hosts, args.ranks_per_host
    with hostlab.HostLab(H, rate_gbit=args.rate_gbit) as lab, tempfile.TemporaryDirectory() as out:
        argv = [os.path.abspath(__file__), "--rank", out, "--repeats", str(args.repeats), "--sizes-mib",
                *map(str, args.sizes_mib)]
        runs = lab.run([L] * H, argv, {"RINGZERO_TIMEOUT_S": "300"}, timeout_s=1800)
        bad = [r for r in runs if r.returncode != 0]
        if bad:
            raise SystemExit(f"host {bad[0].host} failed:\n{bad[0].output[-4000:]}")
        with open(os.path.join(out, "bench.json")) as f:
            result = json.load(f)
    rate = args.rate_gbit * 1e9 / 8
    print(f"# hostlab_all_to_all | {H} hosts x {L} ranks | {args.rate_gbit:g} Gbit/s per host and direction "
          f"(tbf burst {lab.burst_bytes} B) | float32 | median of {args.repeats} [range], slowest rank, ms | "
          f"ringzero.* transport {result['transport']}")
    print(f"{'op':<10} | {'MiB':>4} | {'bound':>6} | {'ringzero.*':>18} | {'of bound':>8} | {'backend':>18} | "
          f"{'of bound':>8} | {'gloo':>18} | {'gloo/rz.*':>9} | {'gloo/be':>7} | load")
    for row in result["rows"]:
        per_rank = row["bytes"]
        bounds = {"": L * (H - 1) / H * per_rank / rate * 1e3, "gather ": (H - 1) * L * per_rank / rate * 1e3,
                  "scatter ": (H - 1) * L * per_rank / rate * 1e3}
        for op, prefix in (("all_to_all", ""), ("gather", "gather "), ("scatter", "scatter ")):
            ms, rng = row["ms"], row["range"]
            cell = lambda k: f"{ms[k]:7.1f} [{rng[k][0]:.0f}-{rng[k][1]:.0f}]"  # noqa: E731
            rz, be, gl, bound = ms[prefix + "ringzero.*"], ms[prefix + "backend"], ms[prefix + "gloo"], bounds[prefix]
            print(f"{op:<10} | {row['mib']:>4g} | {bound:>6.1f} | {cell(prefix + 'ringzero.*'):>18} | "
                  f"{bound / rz:>8.0%} | {cell(prefix + 'backend'):>18} | {bound / be:>8.0%} | "
                  f"{cell(prefix + 'gloo'):>18} | {gl / rz:>8.2f}x | {gl / be:>6.2f}x | {row['load']:.1f}")
    print(f"# backend_stats of the ringzero group on rank 0: {result['stats']}")


if __name__ == "__main__":
    sys.exit(main())
