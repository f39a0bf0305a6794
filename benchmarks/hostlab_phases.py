"""Where the time of a collective across lab hosts goes (issue 36 item 1): the hierarchical all-reduce's
phases alone (in-host reduce-scatter, the cross-host ring, in-host all-gather), and the bare link as
gloo point-to-point sees it (one way or both ways at once, one flow or one per local rank, by slice).

Run as root: nice -n 19 python benchmarks/hostlab_phases.py [--rates-gbit 1] [--hosts 2] [--ranks 2]
Every row is the slowest rank's median of --repeats, in ms, with the link bound of its bytes beside it.
"""
import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "helpers"))
sys.path.insert(0, HERE)
from hostlab_bench import slowest_median_ms  # noqa: E402


def rank_main(out: str, mib: float, repeats: int, segments_mib: list[float]):
    import torch
    import torch.distributed as dist

    import ringzero
    from ringzero.comm import transports

    dist.init_process_group("gloo")
    comm = ringzero.get_communicator(dist.group.WORLD)
    L, H = comm.local_world, len(comm.hosts)
    x = torch.ones(int(mib * (1 << 20)) // 4)
    part = x.new_empty(x.numel() // L)
    peer_pos = (comm.cross_ring.pos + 1) % H if H > 1 else 0
    peer = comm.cross_ring.members[peer_pos]
    bound_bytes = {}  # what one host's link carries each way, per case

    def sendrecv(nbytes, slice_bytes, both, ranks):
        """Point-to-point to the next host's rank of the same local rank (ranks: which local ranks take part)."""
        if comm.local_rank not in ranks:
            return
        t = x[: nbytes // 4]
        r = torch.empty_like(t)
        per = slice_bytes // 4
        me_first = comm.cross_ring.pos % 2 == 0
        ws = []
        if both or me_first:
            ws += [dist.isend(s, peer) for s in t.split(per)]
        if both or not me_first:
            ws += [dist.irecv(s, comm.cross_ring.members[(comm.cross_ring.pos - 1) % H]) for s in r.split(per)]
        for w in ws:
            w.wait()

    def cross(slice_bytes):
        comm.cross_ring.slice_bytes = slice_bytes
        comm.cross_ring.begin("phases cross")
        comm.cross_ring.all_reduce(part, ringzero.ReduceOp.SUM)

    n = x.numel() * 4
    cases = {
        "shm reduce_scatter": (lambda: comm.shm.reduce_scatter(x, part, 0), 0),
        "shm all_gather": (lambda: comm.shm.all_gather(part, x), 0),
        "hierarchical all_reduce": (lambda: ringzero.all_reduce(x), n * (H - 1) / H * 2),
        # gloo's flat ring: one edge per direction crosses each link, carrying 2(n-1)/n of the buffer.
        "gloo all_reduce": (lambda: dist.all_reduce(x), 2 * (H * L - 1) / (H * L) * n),
    }
    def hierarchical(segment_bytes, slice_bytes):
        transports.PIPELINE_SEGMENT_BYTES = segment_bytes
        comm.cross_ring.slice_bytes = slice_bytes
        ringzero.all_reduce(x)

    def in_host_segments(segment_bytes):
        per = segment_bytes // 4
        for seg, p in zip(x.split(per), part.split(per // L)):
            comm.shm.reduce_scatter(seg, p, 0)
            comm.shm.all_gather(p, seg)

    for seg in segments_mib:
        cases[f"shm reduce_scatter + all_gather, segment {seg:g} MiB"] = (
            lambda seg=seg: in_host_segments(int(seg * (1 << 20))), 0)
    for seg in segments_mib:
        for sb in (256 << 10, 1 << 20):
            cases[f"hierarchical, segment {seg:g} MiB, slice {sb >> 10} KiB"] = (
                lambda seg=seg, sb=sb: hierarchical(int(seg * (1 << 20)), sb), n * (H - 1) / H * 2)
    for sb in (256 << 10, 1 << 20, 4 << 20):
        cases[f"cross ring all_reduce, slice {sb >> 10} KiB"] = (lambda sb=sb: cross(sb), n * (H - 1) / H * 2)
    half = n // 2
    for sb in (256 << 10, 1 << 20):
        for both in (False, True):
            for ranks in ([0], list(range(L))):
                name = (f"p2p {half >> 20} MiB {'both ways' if both else 'one way'}, {len(ranks)} flow(s), "
                        f"slice {sb >> 10} KiB")
                cases[name] = (lambda sb=sb, both=both, ranks=ranks: sendrecv(half, sb, both, ranks), half * len(ranks))
    rows = []
    for name, (fn, link_bytes) in cases.items():
        rows.append({"case": name, "ms": slowest_median_ms(fn, repeats), "link_bytes": link_bytes,
                     "load": os.getloadavg()[0]})
    if dist.get_rank() == 0:
        with open(os.path.join(out, "phases.json"), "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates-gbit", type=float, nargs="+", default=[1])
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--ranks", type=int, default=2, help="ranks per host")
    p.add_argument("--mib", type=float, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--segments-mib", type=float, nargs="*", default=[1, 2, 4],
                   help="segment sizes of the pipelined hierarchical all-reduce to time")
    p.add_argument("--rank", metavar="OUT", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank:
        return rank_main(args.rank, args.mib, args.repeats, args.segments_mib)
    import hostlab

    for rate in args.rates_gbit:
        with hostlab.HostLab(args.hosts, rate_gbit=rate) as lab, tempfile.TemporaryDirectory() as out:
            argv = [os.path.abspath(__file__), "--rank", out, "--repeats", str(args.repeats), "--mib", str(args.mib),
                    "--segments-mib", *map(str, args.segments_mib)]
            runs = lab.run([args.ranks] * args.hosts, argv, {"RINGZERO_TIMEOUT_S": "300"}, timeout_s=900)
            bad = [r for r in runs if r.returncode != 0]
            if bad:
                raise SystemExit(f"host {bad[0].host} failed:\n{bad[0].output[-4000:]}")
            rows = json.load(open(os.path.join(out, "phases.json")))
        print(f"\n# {args.hosts} hosts x {args.ranks} ranks, {args.mib:g} MiB float32, link {rate:g} Gbit/s "
              f"(tbf burst {lab.burst_bytes} B), median of {args.repeats}, slowest rank")
        print(f"{'case':<48} | {'ms':>7} | {'bound ms':>8} | {'of bound':>8} | load")
        for r in rows:
            bound = r["link_bytes"] * 8 / (rate * 1e9) * 1e3 if r["link_bytes"] else None
            print(f"{r['case']:<48} | {r['ms']:>7.1f} | {bound or 0:>8.1f} | "
                  f"{(bound / r['ms'] if bound else 0):>8.0%} | {r['load']:.2f}")


if __name__ == "__main__":
    main()
