"""CUDA benchmark: reduction kernels and simulated-rank collectives (all-reduce, all-to-all) against the
measured HBM floor.

    python benchmarks/bench_cuda.py [--quick] [--ranks 2,4,8]

Roofline model for simulated ranks (all N ranks share one HBM and one L2): whatever the algorithm, an
all-reduce must read every rank's input once and write every rank's output once, N x S bytes each way.
The floor is the measured time of exactly that traffic: one device-to-device copy of N x S bytes, in a
CUDA graph like the collective, at the same total size (so L2 helps it exactly as much). Staging copies,
extra peer reads and flags are the algorithm's own cost, not part of the floor (L2 may absorb them), so
"of floor" = floor time / our time can never exceed 100%; a value above it is flagged as a MODEL ERROR
and makes the run fail. (The 2026-11-22 table counted every rank's reads of every peer as separate HBM
traffic, (N+3)S per rank for one-shot, which the shared L2 serves once: hence its impossible 181%.)

Baseline on the same GPU, same process, same graph timing: "torch", torch.stack(xs).sum(0) copied into
the N outputs (what a user writes for simulated ranks). No NCCL row: NCCL refuses two ranks on one GPU,
and its world-size-1 all_reduce (the row this table had until 2026-11-28) is in place a no-op, so CUDA
graph capture recorded an empty graph and timed nothing (0.4-2.8 us at every size, 287-14966% "of floor"
on an H200). Every row, baseline or ours, is checked against the floor.
Columns follow nccl-tests: size (per rank), count, dtype, time, algbw = size/time, busbw = algbw *
2(n-1)/n. Times are per call, from a CUDA graph of `iters` back-to-back calls (launch overhead
excluded, as for a captured model). Not done: torch.distributed NCCL on several GPUs (docs/cuda.md).
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys

import torch

import ringzero
from ringzero import _C
from ringzero.comm import cuda as rz_cuda

SUM = int(ringzero.ReduceOp.SUM)
ALGOS = {"oneshot": 1, "twoshot": 2, "ring": 3}


def time_graph(fn, iters: int) -> float:
    """Seconds per fn() call, from a CUDA graph of `iters` calls replayed after a warm-up."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 3
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / (reps * iters)


def copy_time(nbytes: int, iters: int = 5) -> float:
    """Seconds of one device-to-device copy of nbytes (nbytes read + nbytes written), graph-timed."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return time_graph(lambda: b.copy_(a), iters)


def copy_bandwidth(nbytes: int) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting read + write (2 x nbytes per copy)."""
    return 2 * nbytes / copy_time(nbytes)


def fmt_size(b: int) -> str:
    for unit, k in [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)]:
        if b >= k:
            return f"{b / k:g} {unit}"
    return f"{b} B"


def bench_reduce(copy_bw: float, nbytes: int, out):
    out(f"\n## reduction kernel (dst = a + b), {fmt_size(nbytes)} per operand; bytes moved = 3 x size")
    out(f"{'dtype':>9} {'time_us':>9} {'GB/s':>8} {'of copy bw':>10}")
    for dtype in rz_cuda.CUDA_DTYPES:
        n = nbytes // torch.tensor([], dtype=dtype).element_size()
        a = torch.ones(n, dtype=dtype, device="cuda")
        b = torch.ones_like(a)
        d = torch.empty_like(a)
        t = time_graph(lambda: _C.cuda_reduce_(d, [a, b], SUM, 1), 5)
        gbs = 3 * nbytes / t
        out(f"{str(dtype).replace('torch.', ''):>9} {t * 1e6:9.1f} {gbs / 1e9:8.1f} {gbs / copy_bw:10.1%}")


def bench_simulated(ranks: list[int], sizes: list[int], out) -> int:
    """The all-reduce tables; returns how many ratios broke the floor (model errors)."""
    errors = 0
    for n in ranks:
        out(f"\n## all-reduce, {n} simulated ranks on one GPU (float32). floor = one copy of the {n} inputs to the "
            f"{n} outputs ({n} x size read + written, graph-timed at this size): the least any all-reduce moves on "
            "one shared HBM/L2; of floor = floor time / time, never above 100%. vs torch = torch time / time.")
        out(f"{'size':>9} {'count':>10} {'algo':>8} {'time_us':>9} {'algbw':>7} {'busbw':>7} {'floor_us':>8} "
            f"{'of floor':>8} {'vs torch':>8}")
        sim = rz_cuda.simulated_world(n, staging_bytes=64 << 20)
        best = []
        for size in sizes:
            count = size // 4
            xs = [torch.ones(count, device="cuda") for _ in range(n)]
            outs = [torch.empty_like(x) for x in xs]
            iters = 20 if size <= (1 << 20) else 3
            floor = copy_time(n * size, iters)

            def torch_all_reduce():
                r = torch.stack(xs).sum(0)
                for o in outs:
                    o.copy_(r)

            times = {"torch": time_graph(torch_all_reduce, iters)}
            for name, algo in ALGOS.items():
                times[name] = time_graph(lambda: sim.run(rz_cuda.ALL_REDUCE, xs, outs, SUM, algo), iters)
            for name, t in times.items():
                algbw = size / t / 1e9
                ratio = floor / t
                flag = ""
                if ratio > 1.0:  # a baseline too: then it timed less than the traffic it must move
                    flag = "  MODEL ERROR: faster than the floor"
                    errors += 1
                vs = "" if name == "torch" else f"{times['torch'] / t:7.2f}x"
                out(f"{fmt_size(size):>9} {count:>10} {name:>8} {t * 1e6:9.1f} {algbw:7.2f} "
                    f"{algbw * 2 * (n - 1) / n:7.2f} {floor * 1e6:8.1f} {ratio:8.1%} {vs:>8}{flag}")
            ours = {k: v for k, v in times.items() if k in ALGOS}
            best.append((size, min(ours, key=ours.get)))
            del xs, outs
        out("fastest per size (set the Auto thresholds in peer_comm.h from this): " +
            ", ".join(f"{fmt_size(s)}: {a}" for s, a in best))
    return errors


def bench_all_to_all(ranks: list[int], sizes: list[int], out) -> int:
    """The all-to-all tables (even splits, float32); returns how many ratios broke the floor. Each size is
    checked exact against torch's result before it is timed (an error stops the run)."""
    errors = 0
    for n in ranks:
        out(f"\n## all-to-all, {n} simulated ranks on one GPU (float32, even splits; size = one rank's input). "
            f"floor = one copy of the {n} inputs to the {n} outputs (graph-timed at this size): the least any "
            "all-to-all moves; ours stages each input once and reads it once (2 copies), so about 50% of the floor "
            "is its model's bound where L2 does not hold the staging. torch = torch.cat of every rank's block "
            "into each output (one copy: what a user writes for simulated ranks).")
        out(f"{'size':>9} {'count':>10} {'who':>8} {'time_us':>9} {'algbw':>7} {'floor_us':>8} {'of floor':>8} "
            f"{'vs torch':>8}")
        sim = rz_cuda.simulated_world(n, staging_bytes=64 << 20)
        for size in sizes:
            count = size // 4 // n * n
            block = count // n
            xs = [torch.arange(count, device="cuda", dtype=torch.float32) + q * count for q in range(n)]
            outs = [torch.empty_like(x) for x in xs]
            want = [torch.empty_like(x) for x in xs]
            counts = [torch.full((n,), block, dtype=torch.int64, device="cuda") for _ in range(n)]
            iters = 20 if size <= (1 << 20) else 3

            def torch_all_to_all():
                for r in range(n):
                    torch.cat([x[r * block:(r + 1) * block] for x in xs], out=want[r])

            def ours():
                sim.all_to_all(xs, outs, counts)

            torch_all_to_all()
            ours()
            torch.cuda.synchronize()
            sim.check()
            for r in range(n):
                if not torch.equal(outs[r], want[r]):
                    raise AssertionError(f"all-to-all, {n} ranks, {fmt_size(size)}: rank {r}'s output differs from torch's")
            floor = copy_time(n * count * 4, iters)
            times = {"torch": time_graph(torch_all_to_all, iters), "ringzero": time_graph(ours, iters)}
            for name, t in times.items():
                ratio = floor / t
                flag = ""
                if ratio > 1.0:
                    flag = "  MODEL ERROR: faster than the floor"
                    errors += 1
                vs = "" if name == "torch" else f"{times['torch'] / t:7.2f}x"
                out(f"{fmt_size(size):>9} {count:>10} {name:>8} {t * 1e6:9.1f} {count * 4 / t / 1e9:7.2f} "
                    f"{floor * 1e6:8.1f} {ratio:8.1%} {vs:>8}{flag}")
            del xs, outs, want
    return errors


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer sizes (a smoke run)")
    p.add_argument("--ranks", default="2,4,8", help="simulated rank counts, comma-separated")
    p.add_argument("--out", default=None, help="also write the output to this file")
    args = p.parse_args()
    if not (getattr(_C, "has_cuda", False) and torch.cuda.is_available()):
        print("bench_cuda: needs a CUDA GPU and a CUDA build of ringzero; nothing measured")
        return 1
    lines = []

    def out(s=""):
        print(s, flush=True)
        lines.append(s)

    props = torch.cuda.get_device_properties(0)
    out(f"# ringzero CUDA benchmark, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
    out(f"device: {props.name}, {props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs; "
        f"torch {torch.__version__} CUDA {torch.version.cuda}; host {os.uname().nodename}")
    copy_bw = copy_bandwidth(256 << 20)
    out(f"device-to-device copy bandwidth (256 MiB, read + write counted): {copy_bw / 1e9:.0f} GB/s")
    bench_reduce(copy_bw, 256 << 20, out)
    sizes = [4 << 10, 64 << 10, 1 << 20, 64 << 20] if args.quick else \
        [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
    ranks = [int(r) for r in args.ranks.split(",")]
    errors = bench_simulated(ranks, sizes, out)
    errors += bench_all_to_all(ranks, sizes, out)
    if errors:
        out(f"\n{errors} MODEL ERROR(s): a row beat the floor, so the floor's model or the timing is wrong")
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
