"""Collectives across hosts of the lab (tests/helpers/hostlab.py: network namespaces joined by veths to a bridge,
each link shaped with tbf): ringzero's all-reduce, reduce-scatter and all-gather (hierarchical where
every host has the same number of ranks), its flat ring, and gloo's own, beside the link bound and the
alpha-beta prediction of `ringzero estimate` for the same link (estimate/network.py).

The link bound is the bytes each host's link must carry each way for ringzero's algorithm, over the
rate: hierarchical all-reduce 2(H-1)/H of the tensor, reduce-scatter and all-gather (H-1)/H of the
whole buffer (input, output); with H hosts. "of bound" is the bound over the time.

The estimate is calibrated from the op's own parts, each run alone in the same repeats as the whole
(the ways take turns): "in-host" (its shared-memory steps, with a cross-host step that does nothing),
"cross" (its cross-host steps, with in-host steps that do nothing), "staging" (neither: the pipeline's
own copies, held by both of the others) and "link" (bare gloo point-to-point moving the op's cross-host
bytes). Where the cross-host steps move under 90% of the TCP goodput, the cores set the time: [Note:
where the cores set the time] in ringzero/estimate/network.py.

Run as root: nice -n 19 python benchmarks/hostlab_bench.py [--rates-gbit 1 10] [--sizes-mib 16 64]
[--hosts 2] [--ranks-per-host 2]. It prints one table per link rate with the load average; the per-rank
part (--rank) is what torchrun starts on each host.
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
OPS = ("all_reduce", "reduce_scatter", "all_gather")
SLICE_NUMEL = (1 << 20) // 4  # the bare link's messages: the rings' default 1 MiB slices


def rank_main(out: str, sizes_mib: list[float], repeats: int, ops: list[str]):
    """Times each op on float32 buffers of each size (the whole buffer: all-reduce's tensor, reduce-scatter's
    input, all-gather's output); rank 0 writes the slowest rank's medians (ms)."""
    import torch
    import torch.distributed as dist

    import ringzero

    dist.init_process_group("gloo")
    comm = ringzero.get_communicator(dist.group.WORLD)
    world = dist.get_world_size()

    def flat(x):
        comm.flat_ring.begin("bench flat all_reduce")
        comm.flat_ring.all_reduce(x, ringzero.ReduceOp.SUM)

    transport = comm.transport
    shm = comm.shm
    nothing = lambda *a: None  # noqa: E731

    def in_host(op, x, piece, shm=shm):
        """The op's in-host steps alone, as the pipelined collective runs them (comm/hierarchical.py) with a
        cross-host step that does nothing: what calibrates the estimate's in-host link for this op. With
        shm=NoHostStep(): only the pipeline's own staging (its copies and buffers), which the in-host and
        the cross-host runs both hold."""
        from ringzero.comm import hierarchical as hier

        rs = lambda staged, part: shm.reduce_scatter(staged, part, int(ringzero.ReduceOp.SUM))  # noqa: E731
        spin = shm.spin
        shm.set_spin(False)  # as inside the pipelined collectives (comm/transports.py _pipeline)
        if op == "all_reduce":
            hier.all_reduce_pipelined(x, comm.local_world, transport.segment_numel(x), rs, nothing, nothing,
                                      shm.all_gather)
        elif op == "reduce_scatter":
            hier.reduce_scatter_pipelined(x, piece, transport.hosts, transport.block_segment_numel(x), rs, nothing,
                                          nothing)
        else:
            hier.all_gather_pipelined(piece, x, transport.hosts, transport.cross_ring.pos,
                                      transport.block_segment_numel(x), shm.all_gather, nothing, nothing)
        shm.set_spin(spin)

    class NoHostStep:
        """Stands in for the shared-memory segment: the in-host steps do nothing (their outputs keep what
        they held), so that the transport runs only its cross-host steps, pipelined as usual."""
        spin = False

        def __getattr__(self, name):
            return nothing

    def cross(op, x, piece):
        """The op's cross-host steps alone, as the transport runs them (its worker thread, segment by segment)."""
        real, transport.shm = transport.shm, NoHostStep()
        try:
            {"all_reduce": lambda: transport.all_reduce(x, ringzero.ReduceOp.SUM),
             "reduce_scatter": lambda: transport.reduce_scatter(piece, x, ringzero.ReduceOp.SUM),
             "all_gather": lambda: transport.all_gather(x, piece)}[op]()
        finally:
            transport.shm = real

    def link(op, x):
        """The bare link as gloo point-to-point moves it: every rank sends to its cross-host ring neighbour
        what the op's cross-host step sends, (H-1)/H of its 1/L share (twice that for all_reduce), while
        it receives as much."""
        ring = comm.cross_ring or comm.flat_ring
        t = x[: int(link_share(op, len(comm.hosts)) * x.numel() / comm.local_world)]
        got = torch.empty_like(t)
        works = [dist.irecv(s, ring.left) for s in got.split(SLICE_NUMEL)]  # first, as the rings do
        works += [dist.isend(s, ring.right) for s in t.split(SLICE_NUMEL)]
        for w in works:
            w.wait()

    rows = []
    for mib in sizes_mib:
        x = torch.ones(int(mib * (1 << 20)) // 4 // world * world)
        piece = x.new_empty(x.numel() // world)
        ways = {"all_reduce": {"ringzero": lambda: ringzero.all_reduce(x), "gloo": lambda: dist.all_reduce(x),
                               "flat ring": lambda: flat(x)},
                "reduce_scatter": {"ringzero": lambda: ringzero.reduce_scatter_single(piece, x),
                                   "gloo": lambda: dist.reduce_scatter_tensor(piece, x)},
                "all_gather": {"ringzero": lambda: ringzero.all_gather_into_tensor(x, piece),
                               "gloo": lambda: dist.all_gather_into_tensor(x, piece)}}
        for op in OPS:
            if comm.hierarchical and transport.segment_numel(x) and transport.block_segment_numel(x):
                ways[op]["in host"] = lambda op=op: in_host(op, x, piece)
                ways[op]["cross"] = lambda op=op: cross(op, x, piece)
                ways[op]["staging"] = lambda op=op: in_host(op, x, piece, NoHostStep())
            ways[op]["link"] = lambda op=op: link(op, x)
        for op in ops:
            row = {"op": op, "bytes": x.numel() * 4}
            row["busy"] = {}
            row.update(slowest_medians_ms(ways[op], repeats, row["busy"]))
            row["load"] = os.getloadavg()[0]
            rows.append(row)
    if dist.get_rank() == 0:
        with open(os.path.join(out, "bench.json"), "w") as f:
            json.dump({"rows": rows, "hierarchical": comm.hierarchical}, f)
    dist.destroy_process_group()


def run_in_lab(lab, ranks_per_host: list[int], argv: list[str], out: str, timeout_s: float) -> dict:
    """Runs argv (a script's --rank part) on every host of `lab` under torchrun with RINGZERO_TIMEOUT_S=300;
    exits naming the first host that failed, else returns what rank 0 wrote to <out>/bench.json."""
    runs = lab.run(ranks_per_host, argv, {"RINGZERO_TIMEOUT_S": "300"}, timeout_s=timeout_s)
    bad = [r for r in runs if r.returncode != 0]
    if bad:
        raise SystemExit(f"host {bad[0].host} failed:\n{bad[0].output[-4000:]}")
    with open(os.path.join(out, "bench.json")) as f:
        return json.load(f)


def slowest_median_ms(fn, repeats: int) -> float:
    """fn timed `repeats` times after one warm-up (connections, buffers), each run started together by a
    barrier: the slowest rank's median, in ms (every rank of the default group calls it)."""
    return slowest_medians_ms({"fn": fn}, repeats)["fn"]


def slowest_medians_ms(ways: dict, repeats: int, busy: dict | None = None) -> dict:
    """Each of `ways` (name -> fn) timed `repeats` times after one warm-up each, the ways taking turns within
    every repeat (so that a slow spell of the machine falls on all of them, not on one), each run started
    together by a barrier: name -> the slowest rank's median, in ms (every rank of the default group calls
    it). busy: if given, busy[name] gets the share of the machine's cpu time that was not idle over that
    way's timed runs (from /proc/stat, which the lab's hosts share: all hosts' work)."""
    import torch
    import torch.distributed as dist

    for fn in ways.values():
        fn()
    times = {name: [] for name in ways}
    spent = {name: [0, 0] for name in ways}  # jiffies: all, idle
    for _ in range(repeats):
        for name, fn in ways.items():
            dist.barrier()
            before = cpu_times()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
            after = cpu_times()
            if before and after:
                spent[name][0] += sum(after) - sum(before)
                spent[name][1] += (after[3] + after[4]) - (before[3] + before[4])  # idle, iowait
    if busy is not None:
        for name, (total, idle) in spent.items():
            busy[name] = 1 - idle / total if total > 0 else None
    worst = torch.tensor([statistics.median(times[name]) for name in ways], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # the slowest rank's median is the collective's time
    return {name: v * 1e3 for name, v in zip(ways, worst.tolist())}


def cpu_times() -> list[int] | None:
    """The machine's cpu line of /proc/stat (user nice system idle iowait irq softirq steal), or None."""
    try:
        with open("/proc/stat") as f:
            return [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None


def pct(share) -> str:
    return "-" if share is None else f"{share:.0%}"


def link_share(op: str, hosts: int) -> float:
    """The share of the whole buffer that ringzero's (hierarchical) algorithm sends over one host's link
    each way: all_reduce 2(H-1)/H, reduce_scatter and all_gather (H-1)/H."""
    return (2 if op == "all_reduce" else 1) * (hosts - 1) / hosts


def link_bound_ms(op: str, nbytes: int, hosts: int, rate_gbit: float) -> float:
    """What one host's link must carry each way for ringzero's (hierarchical) algorithm, over the rate."""
    return link_share(op, hosts) * nbytes * 8 / (rate_gbit * 1e9) * 1e3


def calibrated_intra_gbps(op: str, nbytes: int, in_host_ms: float, local: int) -> float:
    """The in-host link speed that makes the alpha-beta ring model of the op's in-host steps (all_reduce:
    reduce-scatter + all-gather, 2 (L-1)/L of the buffer per rank; reduce_scatter, all_gather: (L-1)/L;
    latency neglected) take the measured in_host_ms."""
    return (2 if op == "all_reduce" else 1) * (local - 1) / local * nbytes * 8 / (in_host_ms * 1e-3) / 1e9


TCP_GOODPUT = 1448 / 1514
"""TCP payload per frame on the lab's veths (MTU 1500, timestamps on: 1448 bytes in a 1514-byte frame, which
is what tbf counts): the share of the shaped rate that carries data (gloo's flat ring reached 96%)."""


def predicted_ms(op: str, nbytes: int, rate_gbit: float, intra_gbps: float, latency_us: float, hosts: int,
                 local: int, link_gbps: float, cores_gbps: float | None = None) -> dict:
    """`ringzero estimate`'s times for the lab: the link at its TCP goodput, one NIC per host, the hierarchical
    steps pipelined over ringzero's segments (comm/transports.py). link_gbps: what the bare link moved
    (gloo point-to-point, both ways at once); cores_gbps (default link_gbps): what the op's own cross-host
    steps moved, alone. Where that is under 90% of the goodput the host's cores, not the link, set the
    rate, and the model takes it as the host's (Cluster.host_bytes_per_s): [Note: where the cores set
    the time]."""
    import dataclasses

    from ringzero.comm.transports import pipeline_segment_bytes
    from ringzero.estimate.network import GroupShape, collective_times, custom_cluster

    cluster = custom_cluster(intra_gbps, rate_gbit * TCP_GOODPUT, latency_us, gpus_per_node=local, nics_per_node=1)
    cross_gbps = cores_gbps or link_gbps
    cores = cross_gbps / 8 * 1e9 if cross_gbps < 0.9 * rate_gbit * TCP_GOODPUT else None
    cluster = dataclasses.replace(cluster, pipeline_segment_bytes=pipeline_segment_bytes(nbytes),
                                  host_bytes_per_s=cores)
    times = collective_times(op, nbytes, GroupShape(hosts * local, hosts, local), cluster)
    return {k: v * 1e3 for k, v in times.items()}


TRAIN_ARGS = ["--steps", "10", "--batch", "8", "--seq", "64", "--layers", "4", "--d-model", "256", "--heads", "4",
              "--val-every", "0", "--no-progress"]
"""The training row's model: 3.3M parameters (13 MiB of float32 gradients per step against 2 x 64 x 4 tokens
of compute per rank), so that the link, not the 2 cores, is most of a step at 1 Gbit/s."""
TRAIN_PAIRS = (("ddp", "torch-ddp"), ("zero2", "torch-fsdp2"))


def train_rows(lab, hosts: int, local: int, out: str) -> list[tuple]:
    """tokens/s of `ringzero train` for each (ringzero, torch) pair of TRAIN_PAIRS, every run on the lab's hosts."""
    rows = []
    for ours, theirs in TRAIN_PAIRS:
        tps = []
        for strategy in (ours, theirs):
            folder = os.path.join(out, strategy)
            how = ["--strategy", strategy] if strategy == ours else ["--compare", strategy]
            runs = lab.run([local] * hosts, ["-m", "ringzero.cli.train", *how, *TRAIN_ARGS, "--out", folder],
                           {"RINGZERO_TIMEOUT_S": "300"}, timeout_s=900)
            bad = [r for r in runs if r.returncode != 0]
            if bad:
                raise SystemExit(f"train {strategy}: host {bad[0].host} failed:\n{bad[0].output[-4000:]}")
            with open(os.path.join(folder, "results.json")) as f:
                tps.append(json.load(f)["tokens_per_s"])
        rows.append((ours, theirs, *tps, os.getloadavg()[0]))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates-gbit", type=float, nargs="+", default=[1, 10], help="0: an unshaped veth (no estimate)")
    p.add_argument("--sizes-mib", type=float, nargs="+", default=[16, 64])
    p.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--ranks-per-host", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--burst-bytes", type=int, default=None, help="tbf bucket (default: hostlab's, 1 ms of the rate, "
                   "at least 128 KiB)")
    p.add_argument("--intra-gbps", type=float, default=None, help="the estimate's in-host link (shared memory), "
                   "gigabits/s per rank and direction (default: calibrated from the measured in-host phases)")
    p.add_argument("--latency-us", type=float, default=100.0, help="the estimate's step latency")
    p.add_argument("--train", action="store_true", help="also the training row: tokens/s of `ringzero train` "
                   "ddp and zero2 against torch DDP and FSDP2 on gloo, on the same hosts")
    p.add_argument("--smallest-segment-mib", type=float, default=None,
                   help="the pipelined collectives' smallest segment (comm/transports.py "
                        "PIPELINE_SMALLEST_SEGMENT_BYTES; 4 gives the fixed 4 MiB segments used before 2026-11-27)")
    p.add_argument("--rank", metavar="OUT", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.smallest_segment_mib:  # an A/B of the pipeline's segments, in the ranks and in the estimate
        from ringzero.comm import transports

        transports.PIPELINE_SMALLEST_SEGMENT_BYTES = int(args.smallest_segment_mib * (1 << 20))
    if args.rank:
        return rank_main(args.rank, args.sizes_mib, args.repeats, args.ops)
    import hostlab

    H, L = args.hosts, args.ranks_per_host
    print(f"# hostlab_bench | {H} hosts x {L} ranks | float32 SUM | median of {args.repeats}, slowest rank | "
          f"estimate: --intra-gbps {args.intra_gbps or 'calibrated'} --latency-us {args.latency_us}, one NIC per host")
    for rate in args.rates_gbit:
        with hostlab.HostLab(H, rate_gbit=rate or None, burst_bytes=args.burst_bytes) as lab, \
                tempfile.TemporaryDirectory() as out:
            argv = [os.path.abspath(__file__), "--rank", out, "--repeats", str(args.repeats), "--sizes-mib",
                    *map(str, args.sizes_mib), "--ops", *args.ops]
            if args.smallest_segment_mib:
                argv += ["--smallest-segment-mib", str(args.smallest_segment_mib)]
            result = run_in_lab(lab, [L] * H, argv, out, 900)
            trained = train_rows(lab, H, L, out) if args.train else []
        rows, hier = result["rows"], result["hierarchical"]
        print(f"\nlink {rate:g} Gbit/s per host and direction (tbf burst {lab.burst_bytes} B)" if rate else
              "\nunshaped veth (what the CPUs can move)")
        print(f"{'op':<14} | {'MiB':>4} | {'ringzero':>8} | {'bound':>6} | {'of bound':>8} | {'est':>6} | "
              f"{'ms/est':>6} | {'gloo ms':>7} | {'gloo/rz':>7} | {'flat ms':>7} | {'in-host':>7} | {'cross':>7} | {'staging':>7} | "
              f"{'link Gb/s':>9} | {'cpu busy rz/in/cross/link':>25} | load")
        for row in rows:
            op, nbytes = row["op"], row["bytes"]
            bound = link_bound_ms(op, nbytes, H, rate) if rate and (hier or L == 1) else None  # L=1: the flat ring is it
            est = None
            intra = args.intra_gbps or (row.get("in host") and calibrated_intra_gbps(op, nbytes, row["in host"], L))
            if L == 1:  # no in-host step: any in-host link faster than the network leaves the flat ring to it
                intra = 1e3
            link_gbps = link_share(op, H) * nbytes * 8 / (row["link"] * 1e-3) / 1e9
            cross_only = row.get("cross") and row["cross"] - row["staging"]  # the staging is in "in host"
            cores_gbps = link_share(op, H) * nbytes * 8 / (cross_only * 1e-3) / 1e9 if cross_only and cross_only > 0 \
                else None  # none measured (or lost in the noise): the bare link's
            if rate and intra and link_gbps:
                est = predicted_ms(op, nbytes, rate, intra, args.latency_us, H, L, link_gbps, cores_gbps).get(
                    "hierarchical" if hier else "ring")
            cell = lambda v, w, f="{:.1f}": f"{f.format(v) if v is not None else '-':>{w}}"  # noqa: E731
            print(f"{op:<14} | {nbytes / (1 << 20):>4g} | {row['ringzero']:>8.1f} | {cell(bound, 6)} | "
                  f"{cell(bound and bound / row['ringzero'], 8, '{:.0%}')} | {cell(est, 6)} | "
                  f"{cell(est and row['ringzero'] / est, 6, '{:.2f}')} | {row['gloo']:>7.1f} | "
                  f"{row['gloo'] / row['ringzero']:>6.2f}x | {cell(row.get('flat ring'), 7)} | "
                  f"{cell(row.get('in host'), 7)} | {cell(row.get('cross'), 7)} | {cell(row.get('staging'), 7)} | "
                  f"{cell(link_gbps, 9, '{:.2f}')} | "
                  f"{'/'.join(pct(row['busy'].get(k)) for k in ('ringzero', 'in host', 'cross', 'link')):>25} | "
                  f"{row['load']:.2f}")

        if trained:
            print(f"\ntraining, {' '.join(TRAIN_ARGS)}, {H} hosts x {L} ranks, link {rate:g} Gbit/s")
            print(f"{'ringzero':<9} | {'tokens/s':>8} | {'torch':<12} | {'tokens/s':>8} | {'ratio':>6} | load")
            for ours, theirs, ours_tps, theirs_tps, load in trained:
                print(f"{ours:<9} | {ours_tps:>8.0f} | {theirs:<12} | {theirs_tps:>8.0f} | {ours_tps / theirs_tps:>5.2f}x | "
                      f"{load:.2f}")


if __name__ == "__main__":
    main()

