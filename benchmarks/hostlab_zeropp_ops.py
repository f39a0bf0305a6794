"""One ZeRO-3 step's collectives with ZeRO++'s options, each kind alone, timed in the lab (2 hosts x 2 ranks
by default, tbf-shaped links) beside `ringzero estimate`'s time for the same row (issue 46: "the estimator
predicts ... the lab times within 15%").

The ranks build the model of benchmarks/hostlab_zeropp.py under ZeroDataParallel(stage=3, zeropp=...) and run
its flat groups' own collectives, with their own buffers and subgroups, as one step of `ringzero train` does
(one micro-batch): qw's gather over the cross-host group then over the host group (every group once, the
forward's gather from the masters), hpz's gather from the secondary (every unit once, the backward's), qg's
reduce-scatter in the host and its all-to-all across hosts (every group once). Each row is one step's calls of
that kind back to back (the link stays busy as in a step with little compute); the rows take turns within
every repeat; the time is the slowest rank's median.

The estimate's rows (estimate/communication.py, network.py) count ZeRO-3's units as the model's layers + 2 of equal
size; the lab has the real groups (one per block, plus the root: embeddings, final norm and head). The estimate
is told the lab's link: the rate at TCP goodput (1448/1514 of it), one NIC per host, --latency-us per step,
and for the in-host rows --intra-gbps, which by default is calibrated from the lab's own hpz row (a float32
all-gather in the host): so the in-host rows other than hpz are predicted from it, and the cross-host rows from
the link alone.

Run as root: nice -n 19 python benchmarks/hostlab_zeropp_ops.py [--rate-gbit 1] [--repeats 7] [--batch 4]
"""
import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "tests", "helpers"), os.path.join(os.path.dirname(HERE), "python")]

from hostlab_bench import TCP_GOODPUT, run_in_lab, slowest_medians_ms  # noqa: E402

MODEL = dict(layers=4, d_model=320, heads=5, vocab=256)
"""benchmarks/hostlab_zeropp.py's model: 5.12M parameters."""
ROWS = ("weights all-gather, int8 (qw), across hosts", "weights all-gather, int8 (qw), in the host",
        "weights all-gather from the secondary (hpz)", "gradients reduce-scatter in the host (qg)",
        "gradients all-to-all, int4 (qg), across hosts")


def config(seq: int):
    from ringzero.models import GPTConfig
    return GPTConfig(vocab_size=MODEL["vocab"], seq_len=seq, n_layer=MODEL["layers"], n_head=MODEL["heads"],
                     d_model=MODEL["d_model"])


def rank_main(out: str, seq: int, repeats: int, zeropp: str):
    import torch
    import torch.distributed as dist

    import ringzero
    from ringzero.models import GPT, Block
    from ringzero.parallel import ZeroDataParallel
    from ringzero.parallel.data_parallel import quantize as qz
    from ringzero.parallel.data_parallel.zeropp_gather import QuantizedGatherAcrossHosts, SecondaryGather

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = ZeroDataParallel(GPT(config(seq)), stage=3, unit=Block, zeropp=zeropp)
    split, groups = model.split, list(model.groups)
    assert split.several_hosts, "run on several hosts"
    units = [g for g in groups if isinstance(g.gather, SecondaryGather)]
    qw = {id(g): next(p for p in g.gather.parts() if isinstance(p, QuantizedGatherAcrossHosts)) for g in groups}
    H, world = split.num_hosts, dist.get_world_size()

    def qw_cross():
        for g in groups:
            ringzero.all_gather_single(qw[id(g)].cross, qw[id(g)].send, group=split.cross_group)

    recv = {id(g): torch.empty(world * qw[id(g)].packed, dtype=torch.uint8) for g in groups}

    def qw_host():
        for g in groups:
            ringzero.all_gather_single(recv[id(g)], qw[id(g)].cross, group=split.host_group)

    full = {id(g): torch.empty(g.layout.padded_numel) for g in units}

    def hpz():
        for g in units:
            ringzero.all_gather_single(full[id(g)], g.gather.secondary, group=split.host_group)

    grads = {id(g): torch.randn(g.layout.padded_numel) for g in groups}
    parts = {id(g): torch.empty(H * g.layout.shard_numel) for g in groups}

    def qg_host():
        for g in groups:
            ringzero.reduce_scatter_single(parts[id(g)], grads[id(g)], group=split.host_group)

    packed = {id(g): qz.quantize(torch.randn(H, g.layout.shard_numel), 4, 256) for g in groups}
    got = {id(g): torch.empty_like(p) for g, p in zip(groups, packed.values())}

    def qg_cross():
        for g in groups:
            dist.all_to_all_single(got[id(g)], packed[id(g)], group=split.exchange_group)

    ways = dict(zip(ROWS, (qw_cross, qw_host, hpz, qg_host, qg_cross)))
    times = slowest_medians_ms(ways, repeats)
    calls = dict(zip(ROWS, (len(groups), len(groups), len(units), len(groups), len(groups))))
    sizes = {"all-gather bytes per call (hpz)": sum(g.layout.padded_numel * 4 for g in units) / max(1, len(units))}
    if dist.get_rank() == 0:
        with open(os.path.join(out, "bench.json"), "w") as f:
            json.dump({"times": times, "calls": calls, "sizes": sizes, "load": os.getloadavg()[0]}, f)
    split.close()
    dist.destroy_process_group()


def estimated_ms(seq: int, batch: int, hosts: int, local: int, zeropp: str, rate_gbit: float, intra_gbps: float,
                 latency_us: float) -> dict:
    """`ringzero estimate`'s time per row for the lab's link (custom cluster: one NIC per host)."""
    from ringzero.estimate.core import estimate
    from ringzero.estimate.network import custom_cluster
    from ringzero.estimate.plan import Plan

    cluster = custom_cluster(intra_gbps, rate_gbit * TCP_GOODPUT, latency_us, gpus_per_node=local, nics_per_node=1)
    plan = Plan("zero3", world=hosts * local, zeropp=zeropp, ranks_per_host=local)
    e = estimate(config(seq), batch=batch, plan=plan, cluster=cluster)
    return {c.what: min(t for t in c.times_s.values() if t is not None) * 1e3 for c in e.collectives}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate-gbit", type=float, default=1.0)
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--ranks-per-host", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--batch", type=int, default=4, help="global batch (the estimate's; the collectives do not depend on it)")
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--zeropp", default="hpz,qw,qg")
    p.add_argument("--intra-gbps", type=float, default=None, help="the estimate's in-host link, gigabits/s per rank and "
                   "direction (default: calibrated from the lab's hpz row)")
    p.add_argument("--latency-us", type=float, default=100.0, help="the estimate's step latency")
    p.add_argument("--burst-bytes", type=int, default=None, help="tbf bucket (default: hostlab's, 1 ms of the rate; "
                   "1048576 is the lab's default before 2026-12-02, which let a step's first MiB through above the rate)")
    p.add_argument("--rank", metavar="OUT", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank:
        return rank_main(args.rank, args.seq, args.repeats, args.zeropp)
    import hostlab

    H, L = args.hosts, args.ranks_per_host
    with hostlab.HostLab(H, rate_gbit=args.rate_gbit, burst_bytes=args.burst_bytes) as lab, tempfile.TemporaryDirectory() as out:
        os.chmod(out, 0o777)
        got = run_in_lab(lab, [L] * H, [os.path.abspath(__file__), "--rank", out, "--seq", str(args.seq),
                                        "--repeats", str(args.repeats), "--zeropp", args.zeropp], out, timeout_s=900)
    lab_ms, calls = got["times"], got["calls"]
    intra = args.intra_gbps
    if intra is None:  # the hpz row: (L-1)/L of the gathered buffer per rank, over the measured time
        hpz = ROWS[2]
        nbytes = got["sizes"]["all-gather bytes per call (hpz)"] * calls[hpz]
        intra = (L - 1) / L * nbytes * 8 / (lab_ms[hpz] * 1e-3) / 1e9
    est = estimated_ms(args.seq, args.batch, H, L, args.zeropp, args.rate_gbit, intra, args.latency_us)
    print(f"# hostlab_zeropp_ops | {H} hosts x {L} ranks | link {args.rate_gbit:g} Gbit/s | zeropp {args.zeropp} | "
          f"median of {args.repeats}, slowest rank | tbf burst {lab.burst_bytes} B | "
          f"load {got['load']:.1f}")
    print(f"# estimate: --inter-gbps {args.rate_gbit * TCP_GOODPUT:.3f} (TCP goodput) --nics-per-node 1 --latency-us "
          f"{args.latency_us:g} --intra-gbps {intra:.1f}{' (from the hpz row)' if args.intra_gbps is None else ''}")
    print(f"{'row (one step of it)':48} | calls | lab ms | estimate ms | lab / estimate")
    total_lab = total_est = 0.0
    for row in ROWS:
        if row not in est:
            continue
        total_lab += lab_ms[row]
        total_est += est[row]
        print(f"{row:48} | {calls[row]:>5} | {lab_ms[row]:>6.2f} | {est[row]:>11.2f} | {lab_ms[row] / est[row]:>13.2f}")
    print(f"{'all rows':48} | {'':>5} | {total_lab:>6.2f} | {total_est:>11.2f} | {total_lab / total_est:>13.2f}")


if __name__ == "__main__":
    main()
