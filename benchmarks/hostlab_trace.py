"""One pipelined collective across lab hosts, step by step (issue 36): when each rank's in-host steps
(shared memory, on the calling thread) and the first and second halves of its cross-host ring (the
second on the transport's worker thread) began and ended, in ms from the call's start, for the last of
six calls. It shows where a cores-bound call (10 Gbit/s in the lab: 4 ranks and both hosts' network
stacks on 2 cores) loses its time.

Run as root: python benchmarks/hostlab_trace.py [--rate-gbit 10] [--mib 16] [--op all_reduce]
"""
import argparse
import json
import os
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "helpers"))
RING_STEPS = ("all_reduce_start", "all_reduce_finish", "reduce_scatter_start", "reduce_scatter_finish",
              "all_gather_start", "all_gather_finish")


def rank_main(out: str, mib: float, op: str):
    import torch
    import torch.distributed as dist

    import ringzero

    dist.init_process_group("gloo")
    transport = ringzero.get_communicator(dist.group.WORLD).transport
    events, t0 = [], [0.0]

    def timed(name, fn):
        def call(*args, **kwargs):
            start = time.perf_counter()
            result = fn(*args, **kwargs)
            events.append((threading.current_thread().name, name, (start - t0[0]) * 1e3,
                           (time.perf_counter() - t0[0]) * 1e3))
            return result
        return call

    class TimedSegment:
        """The shared-memory segment with its reduce_scatter and all_gather timed."""

        def __init__(self, real):
            self.real = real

        def __getattr__(self, name):
            fn = getattr(self.real, name)
            return timed(f"shm {name}", fn) if name in ("reduce_scatter", "all_gather") else fn

    transport.shm = TimedSegment(transport.shm)
    for name in RING_STEPS:
        setattr(transport.cross_ring, name, timed(f"ring {name}", getattr(transport.cross_ring, name)))
    x = torch.ones(int(mib * (1 << 20)) // 4)
    piece = x.new_empty(x.numel() // dist.get_world_size())
    call = {"all_reduce": lambda: ringzero.all_reduce(x),
            "reduce_scatter": lambda: ringzero.reduce_scatter_single(piece, x),
            "all_gather": lambda: ringzero.all_gather_into_tensor(x, piece)}[op]
    for _ in range(6):
        dist.barrier()
        events.clear()
        t0[0] = time.perf_counter()
        call()
        total = (time.perf_counter() - t0[0]) * 1e3
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump({"total_ms": total, "events": sorted(events, key=lambda e: e[2])}, f)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate-gbit", type=float, default=10)
    p.add_argument("--mib", type=float, default=16)
    p.add_argument("--op", choices=("all_reduce", "reduce_scatter", "all_gather"), default="all_reduce")
    p.add_argument("--rank", metavar="OUT", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank:
        return rank_main(args.rank, args.mib, args.op)
    import hostlab

    with hostlab.HostLab(2, rate_gbit=args.rate_gbit) as lab, tempfile.TemporaryDirectory() as out:
        argv = [os.path.abspath(__file__), "--rank", out, "--mib", str(args.mib), "--op", args.op]
        runs = lab.run([2, 2], argv, {"RINGZERO_TIMEOUT_S": "60"}, timeout_s=300)
        bad = [r for r in runs if r.returncode != 0]
        if bad:
            raise SystemExit(f"host {bad[0].host} failed:\n{bad[0].output[-4000:]}")
        print(f"# hostlab_trace | 2 hosts x 2 ranks | {args.op} {args.mib:g} MiB float32 | link {args.rate_gbit:g} Gbit/s "
              f"| the last of 6 calls, ms from its start")
        for rank in range(4):
            with open(os.path.join(out, f"rank{rank}.json")) as f:
                d = json.load(f)
            print(f"\nrank {rank} (host {rank // 2}): {d['total_ms']:.1f} ms")
            for thread, name, a, b in d["events"]:
                where = "worker" if thread.startswith("ringzero-cross") else "caller"
                print(f"  {where:<6} {name:<28} {a:7.2f} - {b:7.2f}  ({b - a:5.2f})")


if __name__ == "__main__":
    main()
