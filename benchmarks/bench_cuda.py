"""CUDA benchmark: reduction kernels and simulated-rank collectives against the measured HBM floor.

    python benchmarks/bench_cuda.py [--quick] [--ranks 2,4,8]

On one GPU every simulated rank shares HBM, so each result is reported as the fraction of the
bytes-moved floor: bytes the algorithm must move (counted below, per kernel) over the device-to-device
copy bandwidth measured in the same run (a copy of S bytes moves 2S). Columns follow nccl-tests:
size (per rank), count, dtype, time, algbw = size/time, busbw = algbw * 2(n-1)/n. Times are per call,
from a CUDA graph of `iters` back-to-back calls (launch overhead excluded, as for a captured model).
Not done yet: the side-by-side run against torch.distributed's NCCL on several GPUs (README).
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


def algo_bytes(algo: str, n: int, size: int) -> float:
    """HBM bytes one call moves over all n ranks for a per-rank message of `size` bytes (see the kernel
    comments in csrc/cuda/*.cu): one-shot (n+3)S per rank, two-shot (5+1/n)S, ring (6n-4)/n S."""
    per_rank = {"oneshot": (n + 3) * size, "twoshot": (5 + 1 / n) * size, "ring": (6 * n - 4) / n * size}[algo]
    return n * per_rank


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


def copy_bandwidth(nbytes: int) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting read + write (2 x nbytes per copy)."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    t = time_graph(lambda: b.copy_(a), 5)
    return 2 * nbytes / t


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


def bench_simulated(copy_bw: float, ranks: list[int], sizes: list[int], out):
    for n in ranks:
        out(f"\n## all-reduce, {n} simulated ranks on one GPU (float32); floor = algorithm bytes / copy bandwidth")
        out(f"{'size':>9} {'count':>10} {'algo':>8} {'time_us':>9} {'algbw':>7} {'busbw':>7} {'kern GB/s':>9} "
            f"{'of floor':>8}")
        sim = rz_cuda.simulated_world(n, staging_bytes=64 << 20)
        best = []
        for size in sizes:
            count = size // 4
            xs = [torch.ones(count, device="cuda") for _ in range(n)]
            outs = [torch.empty_like(x) for x in xs]
            iters = 20 if size <= (1 << 20) else 3
            times = {}
            for name, algo in ALGOS.items():
                t = time_graph(lambda: sim.run(rz_cuda.ALL_REDUCE, xs, outs, SUM, algo), iters)
                times[name] = t
                algbw = size / t / 1e9
                moved = algo_bytes(name, n, size)
                out(f"{fmt_size(size):>9} {count:>10} {name:>8} {t * 1e6:9.1f} {algbw:7.2f} "
                    f"{algbw * 2 * (n - 1) / n:7.2f} {moved / t / 1e9:9.1f} {moved / copy_bw / t:8.1%}")
            best.append((size, min(times, key=times.get)))
            del xs, outs
        out("fastest per size (the Auto thresholds should follow this): " +
            ", ".join(f"{fmt_size(s)}: {a}" for s, a in best))


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
    bench_simulated(copy_bw, ranks, sizes, out)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
