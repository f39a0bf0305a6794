"""All-reduce across hosts of the lab (tests/hostlab.py: network namespaces joined by veths to a bridge,
each link shaped with tbf): ringzero's hierarchical all-reduce, its flat ring, and gloo, beside the
alpha-beta prediction of `ringzero estimate` for the same link (estimate/network.py).

Run as root: nice -n 19 python benchmarks/hostlab_bench.py [--rates-gbit 1 10] [--sizes-mib 4 32]
It prints one table per link rate; the per-rank part (--rank) is what torchrun starts on each host.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

HOSTS, RANKS_PER_HOST = 2, 2


def rank_main(out: str, sizes_mib: list[float], repeats: int):
    """Times the three all-reduces on float32 tensors of each size; rank 0 writes the medians (ms)."""
    import torch
    import torch.distributed as dist

    import ringzero

    dist.init_process_group("gloo")
    comm = ringzero.get_communicator(dist.group.WORLD)
    assert comm.hierarchical, "the bench needs equal hosts of several ranks (hierarchical all-reduce)"

    def flat(x):
        comm.flat_ring.begin("bench flat all_reduce")
        comm.flat_ring.all_reduce(x, ringzero.ReduceOp.SUM)

    def in_host(x):  # the hierarchical all-reduce's two shared-memory phases alone (calibrates --intra-gbps)
        part = x.new_empty(x.numel() // comm.local_world)
        comm.shm.reduce_scatter(x, part, int(ringzero.ReduceOp.SUM))
        comm.shm.all_gather(part, x)

    ways = {"hierarchical": lambda x: ringzero.all_reduce(x), "flat ring": flat, "gloo": lambda x: dist.all_reduce(x),
            "in host": in_host}
    rows = []
    for mib in sizes_mib:
        x = torch.ones(int(mib * (1 << 20)) // 4)
        row = {"bytes": x.numel() * 4}
        for name, fn in ways.items():
            fn(x)  # warm-up (connections, buffers)
            times = []
            for _ in range(repeats):
                dist.barrier()
                t0 = time.perf_counter()
                fn(x)
                times.append(time.perf_counter() - t0)
            worst = torch.tensor([statistics.median(times)], dtype=torch.float64)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # the slowest rank's median is the collective's time
            row[name] = worst.item() * 1e3
        rows.append(row)
    if dist.get_rank() == 0:
        with open(os.path.join(out, "bench.json"), "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def calibrated_intra_gbps(nbytes: int, in_host_ms: float) -> float:
    """The in-host link speed that makes the alpha-beta ring reduce-scatter + all-gather (2 (L-1)/L of the
    buffer per rank, latency neglected) take the measured in_host_ms."""
    return 2 * (RANKS_PER_HOST - 1) / RANKS_PER_HOST * nbytes * 8 / (in_host_ms * 1e-3) / 1e9


def predicted_ms(nbytes: int, rate_gbit: float, intra_gbps: float, latency_us: float) -> dict:
    from ringzero.estimate.network import GroupShape, collective_times, custom_cluster

    cluster = custom_cluster(intra_gbps, rate_gbit, latency_us, gpus_per_node=RANKS_PER_HOST,
                             nics_per_node=1)
    times = collective_times("all_reduce", nbytes, GroupShape(HOSTS * RANKS_PER_HOST, HOSTS, RANKS_PER_HOST), cluster)
    return {k: v * 1e3 for k, v in times.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates-gbit", type=float, nargs="+", default=[1, 10], help="0: an unshaped veth (no estimate)")
    p.add_argument("--sizes-mib", type=float, nargs="+", default=[4, 32])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--burst-bytes", type=int, default=None, help="tbf bucket (default: hostlab's, 1 ms of the rate, "
                   "at least 256 KiB)")
    p.add_argument("--intra-gbps", type=float, default=None, help="the estimate's in-host link (shared memory), "
                   "gigabits/s per rank and direction (default: calibrated from the measured in-host phases)")
    p.add_argument("--latency-us", type=float, default=100.0, help="the estimate's step latency")
    p.add_argument("--rank", metavar="OUT", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank:
        return rank_main(args.rank, args.sizes_mib, args.repeats)
    import hostlab

    print(f"# hostlab_bench | {HOSTS} hosts x {RANKS_PER_HOST} ranks | float32 SUM | median of {args.repeats}, "
          f"slowest rank | estimate: --intra-gbps {args.intra_gbps or 'calibrated'} --latency-us {args.latency_us}, "
          "one NIC per host")
    for rate in args.rates_gbit:
        with hostlab.HostLab(HOSTS, rate_gbit=rate or None, burst_bytes=args.burst_bytes) as lab, tempfile.TemporaryDirectory() as out:
            argv = [os.path.abspath(__file__), "--rank", out, "--repeats", str(args.repeats), "--sizes-mib",
                    *map(str, args.sizes_mib)]
            runs = lab.run([RANKS_PER_HOST] * HOSTS, argv, {"RINGZERO_TIMEOUT_S": "300"}, timeout_s=600)
            bad = [r for r in runs if r.returncode != 0]
            if bad:
                raise SystemExit(f"host {bad[0].host} failed:\n{bad[0].output[-4000:]}")
            with open(os.path.join(out, "bench.json")) as f:
                rows = json.load(f)
        print(f"\nlink {rate:g} Gbit/s per host and direction (tbf burst {lab.burst_bytes} B)" if rate else
              "\nunshaped veth (what the CPUs can move)")
        print(f"{'MiB':>6} | {'hier ms':>8} | {'est':>8} | {'flat ms':>8} | {'est':>8} | {'gloo ms':>8} | "
              f"{'in-host ms':>10} | {'intra Gb/s':>10} | hier/est flat/est")
        for row in rows:
            intra = args.intra_gbps or calibrated_intra_gbps(row["bytes"], row["in host"])
            if not rate:
                print(f"{row['bytes'] / (1 << 20):>6g} | {row['hierarchical']:>8.1f} | {'-':>8} | "
                      f"{row['flat ring']:>8.1f} | {'-':>8} | {row['gloo']:>8.1f} | {row['in host']:>10.1f} | "
                      f"{intra:>10.1f} |")
                continue
            est = predicted_ms(row["bytes"], rate, intra, args.latency_us)
            print(f"{row['bytes'] / (1 << 20):>6g} | {row['hierarchical']:>8.1f} | {est['hierarchical']:>8.1f} | "
                  f"{row['flat ring']:>8.1f} | {est['ring']:>8.1f} | {row['gloo']:>8.1f} | {row['in host']:>10.1f} | "
                  f"{intra:>10.1f} | {row['hierarchical'] / est['hierarchical']:>8.2f} {row['flat ring'] / est['ring']:>8.2f}")


if __name__ == "__main__":
    main()
