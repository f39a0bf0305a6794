"""Collective microbenchmark in the style of nccl-tests: ringzero against gloo in the same run.

    ringzero bench --nproc 2                      # or: torchrun --nproc-per-node 2 -m ringzero bench
    ringzero bench --device cuda --nproc 8        # CUDA tensors beside NCCL: cli/cuda_bench.py

Columns: size (bytes of the whole buffer, as nccl-tests counts it: all_reduce the tensor, reduce_scatter
the input, all_gather the output), count (elements of that buffer), time per call (the slowest rank),
algbw = size / time and busbw = algbw x 2(n-1)/n (all_reduce) or x (n-1)/n (reduce_scatter, all_gather);
the same for gloo on the same tensors (left out under --no-gloo), the speed ratio (gloo time / ringzero
time), and floor%: the time no algorithm can beat, divided by the measured time. That floor is the larger
of two bounds (floor_s): moving the bytes any algorithm must move per rank (read its input, write its
output) at the streaming bandwidth of the same working set (stream_bandwidth: the better of a copy and an
in-place pass, one thread per rank, all ranks at once, net of the probe's own per-call cost), measured just
before and just after the row (the better of the two); and, with two or more ranks, one cache line from
one rank's core to another's (half the round trip of core_round_trip_ns, measured before the rows), since
every rank must learn something from another. The probe streams as many bytes as the row's buffer, so a
cache-resident size is held to cache speed and a DRAM size to DRAM speed: a collective also moves its data
between the ranks' caches, so it can approach the floor, never pass it (a floor% above 100 would mean the
floor model is wrong). The header and footer give the cores' placement (core_placement).
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys

import torch
import torch.distributed as dist

from .launch import launch
from ..timing import time_calls

OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
DEFAULT_OPS = OPS[:3]
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
              "all_gather": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64,
          "int32": torch.int32, "int64": torch.int64}


def parse_size(text: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().rstrip("B")
    unit = t[-1] if t and t[-1] in units else ""
    try:
        return int(float(t[: len(t) - len(unit)]) * units[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {text!r}: use bytes like 8, 4K, 64M") from None


def human(nbytes: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def _max_over_ranks(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _timed(call, budget_s: float, sync) -> float:
    return time_calls(call, sync, _max_over_ranks, budget_s)


def stream_bandwidth(nbytes: int = 64 << 20, budget_s: float = 0.5) -> float:
    """Bytes per second of memory traffic (read + write) one rank gets while all ranks stream `nbytes`
    at once, one thread each (as the collectives run): the better of a copy into a second buffer and
    an in-place pass (x *= 1) over one, which writes lines it has just read and so moves no line twice
    (a copy's first write to a line also reads it, which the in-place all-reduce never pays: measured
    with the copy alone, 16 and 64 MiB all-reduce showed floor% of 111-135: benchmarks/RESULTS.md). Same working
    set as a row of that size: from cache when it fits, else from DRAM.

    Each pass's time is taken net of the same op's time on one element (torch's dispatch, ~1 us here:
    left in, it made a copy of 8-512 bytes look slower than a whole collective, floor% 105-119). Where
    that leaves nothing measurable the result is inf: the bytes then bound nothing (see floor_s)."""
    src, one = torch.ones(max(1, nbytes // 4)), torch.ones(1)
    dst, one_dst = torch.empty_like(src), torch.empty_like(one)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        net = []
        for op in (lambda a, b: b.copy_(a), lambda a, b: a.mul_(1.0)):
            t_one = _timed(lambda: op(one, one_dst), budget_s / 2, dist.barrier)
            net.append(_timed(lambda: op(src, dst), budget_s, dist.barrier) - t_one)
    finally:
        torch.set_num_threads(threads)
    best = min(net)
    return 2 * (src.numel() - 1) * 4 / best if best > 0 and src.numel() > 1 else float("inf")


def floor_s(min_bytes: int, bandwidth: float, round_trip_ns: float | None, world: int) -> float:
    """The time no algorithm can beat: `min_bytes` (what each rank must read and write) at `bandwidth`
    (stream_bandwidth), and with two or more ranks one cache line from a rank's core to another's, half
    `round_trip_ns` (core_round_trip_ns; None where the ranks share one cpu: no bound from it); the larger."""
    one_way_s = (round_trip_ns or 0.0) * 1e-9 / 2 if world > 1 else 0.0
    return max(min_bytes / bandwidth, one_way_s)


# Round trips above this many ns mean the two cores do not share a last-level cache: on the 2-core VM
# 45-75 ns with both vCPUs on one L3, 370-440 ns when the host had put them on two (benchmarks/RESULTS.md,
# "Where the host runs the ranks' cores").
SPLIT_CACHE_NS = 150.0


def core_round_trip_ns(pair=None) -> float | None:
    """ringzero._C.core_round_trip_ns between the two cpus of `pair` (default: the first two of this
    process's affinity set; both must be in it); None when there is no such pair."""
    import ringzero

    cpus = list(pair) if pair else sorted(os.sched_getaffinity(0))[:2]
    return ringzero._C.core_round_trip_ns(cpus[0], cpus[1]) if len(cpus) > 1 else None


def placement_of(round_trips_ns) -> str:
    """"one" when every round trip says one L3, "split" when every one says two, else "mixed"."""
    split = [ns > SPLIT_CACHE_NS for ns in round_trips_ns]
    return "split" if all(split) else "one" if not any(split) else "mixed"


def core_placement(pair=None, ns: float | None = None) -> str:
    """How the first two cpus of this process's affinity set sit: "<ns> ns round trip (one L3)" or
    "(separate L3s)", from core_round_trip_ns (or the `ns` given, measured on `pair`); "one cpu" when there
    is only one. A VM's host may move its vCPUs between the two within a minute, and the large-message
    collectives run up to 2x slower on separate last-level caches, so every benchmark of ours records it
    with its numbers."""
    ns = core_round_trip_ns(pair) if ns is None else ns
    if ns is None:
        return "one cpu"
    cpus = list(pair) if pair else sorted(os.sched_getaffinity(0))
    return f"{ns:.0f} ns round trip cpus {cpus[0]}-{cpus[1]} ({'separate L3s' if ns > SPLIT_CACHE_NS else 'one L3'})"


def _placement_all_ranks() -> tuple[str, float | None]:
    """core_placement() between the first cpus of ranks 0 and 1 (each bound to its own by the launcher,
    comm.affinity.core_share) and the round trip in ns behind it (None: one cpu), measured by rank 0 while
    the others wait in a gloo barrier (asleep, off the cores); rank 0 may run on both cpus while it measures."""
    firsts = [None] * dist.get_world_size()
    dist.all_gather_object(firsts, min(os.sched_getaffinity(0)))
    result = [("", None)]
    if dist.get_rank() == 0:
        mine = os.sched_getaffinity(0)
        pair = firsts[:2] if len(firsts) > 1 and firsts[0] != firsts[1] else None
        if pair:
            os.sched_setaffinity(0, mine | set(pair))
        try:
            ns = core_round_trip_ns(pair)
            result[0] = (core_placement(pair, ns), ns)
        finally:
            os.sched_setaffinity(0, mine)
    dist.broadcast_object_list(result, src=0)
    return result[0]


def _calls(op: str, size: int, dtype, world: int, rank: int):
    import ringzero
    from ringzero.comm import torch_compat

    es = torch.tensor([], dtype=dtype).element_size()
    count = max(1, size // es)
    if op == "all_reduce":
        x = torch.ones(count, dtype=dtype)
        return count, (lambda: ringzero.all_reduce(x)), (lambda: dist.all_reduce(x)), 2 * count * es
    per = max(1, count // world)
    count = per * world
    big, small = torch.ones(count, dtype=dtype), torch.ones(per, dtype=dtype)
    if op == "reduce_scatter":
        return (count, lambda: ringzero.reduce_scatter_single(small, big),
                lambda: torch_compat.reduce_scatter_single(small, big), (count + per) * es)
    if op == "all_to_all":  # size: each rank's input (and output), even blocks, as nccl-tests' alltoall
        out = torch.empty_like(big)
        return (count, lambda: ringzero.all_to_all_single(out, big), lambda: dist.all_to_all_single(out, big),
                2 * count * es)
    return (count, lambda: ringzero.all_gather_single(big, small),
            lambda: torch_compat.all_gather_single(big, small), (count + per) * es)


def run(args):
    import ringzero

    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = DTYPES[args.dtype]
    sizes, s = [], args.min_bytes
    while s <= args.max_bytes:
        sizes.append(s)
        s *= args.factor
    if rank == 0:
        print(f"# ringzero {ringzero.__version__} collectives benchmark | {datetime.date.today()} | {platform.node()} "
              f"| {platform.processor() or platform.machine()} | {os.cpu_count()} cpus | ranks {world} | dtype {args.dtype}"
              f" | reduce kernels {ringzero._C.reduce_isa()}")
        print("# floor%: the larger of (bytes each rank must read and write, at the streaming bandwidth of the same "
              "working set with all ranks streaming, copy or in-place pass, the better, before and after each row) and "
              "(one cache line between two ranks' cores: half the round trip below), over the time")
        print("# time: us per call (slowest rank); algbw, busbw: GB/s" +
              ("" if args.no_gloo else "; ratio = gloo time / ringzero time"))
    placement, round_trip_ns = _placement_all_ranks()
    if rank == 0:
        print(f"# cores before: {placement}", flush=True)
    for op in args.ops:
        if rank == 0:
            print(f"\n## {op}")
            head = f"{'size':>8} {'count':>10} | {'time':>9} {'algbw':>7} {'busbw':>7} {'floor%':>6}"
            if not args.no_gloo:
                head += f" | {'gloo time':>9} {'algbw':>7} {'busbw':>7} | {'ratio':>6}"
            print(head)
        for size in sizes:
            count, ours, gloo, min_bytes = _calls(op, size, dtype, world, rank)
            nbytes = count * torch.tensor([], dtype=dtype).element_size()
            probe_s = min(0.05, args.budget_s)
            bw_before = stream_bandwidth(nbytes, probe_s)
            t = _timed(ours, args.budget_s, ringzero.barrier)
            bw = max(bw_before, stream_bandwidth(nbytes, probe_s))
            tg = None if args.no_gloo else _timed(gloo, args.budget_s, dist.barrier)
            if rank == 0:
                f = BUS_FACTOR[op](world)
                floor = floor_s(min_bytes, bw, round_trip_ns, world) / t
                line = (f"{human(nbytes):>8} {count:>10} | {t * 1e6:>9.1f} {nbytes / t / 1e9:>7.2f} "
                        f"{nbytes / t / 1e9 * f:>7.2f} {100 * floor:>5.0f}%")
                if tg is not None:
                    line += (f" | {tg * 1e6:>9.1f} {nbytes / tg / 1e9:>7.2f} {nbytes / tg / 1e9 * f:>7.2f} | "
                             f"{tg / t:>5.1f}x")
                print(line, flush=True)
    placement, _ = _placement_all_ranks()
    if rank == 0:
        print(f"\n# cores after: {placement}", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(prog="ringzero bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2,
                   help="ranks to start when not under torchrun (default 2; on the CPU forked from a fork server)")
    p.add_argument("--ops", default=",".join(DEFAULT_OPS),
                   help=f"comma-separated, from {', '.join(OPS)} (default: the first three)")
    p.add_argument("--min-bytes", type=parse_size, default=8)
    p.add_argument("--max-bytes", type=parse_size, default=256 << 20)
    p.add_argument("--factor", type=int, default=2, help="size multiplier between rows (default 2)")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--budget-s", type=float, default=0.2, help="seconds of timed calls per row and backend")
    p.add_argument("--no-gloo", action="store_true", help="skip the gloo baseline")
    cuda = p.add_argument_group("CUDA (ringzero.cli.cuda_bench: nccl-tests' columns, NCCL beside ringzero)")
    cuda.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                      help="cuda: CUDA tensors, one process per GPU (--nproc or torchrun), NCCL as the baseline")
    cuda.add_argument("--sim-ranks", type=int, default=None, metavar="N",
                      help="with --device cuda: N simulated ranks on this one GPU, in this process (no NCCL row)")
    cuda.add_argument("--algos", default="auto,oneshot,twoshot,ring",
                      help="with --device cuda: ringzero's all-reduce rows, from auto, oneshot, twoshot, ring")
    cuda.add_argument("--no-nccl", action="store_true", help="with --device cuda: skip the NCCL rows")
    args = p.parse_args(argv)
    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    args.algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    bad = [o for o in args.ops if o not in OPS]
    if bad:
        p.error(f"unknown op(s) {bad}; choose from {', '.join(OPS)}")
    if args.factor < 2:
        p.error("--factor must be at least 2")
    if args.min_bytes < 1 or args.max_bytes < args.min_bytes:
        p.error("need 1 <= --min-bytes <= --max-bytes")
    if args.device == "cpu":
        if args.sim_ranks is not None or args.no_nccl:
            p.error("--sim-ranks and --no-nccl are for --device cuda")
        launch(run, args.nproc, args)
        return 0
    return _main_cuda(p, args)


def _main_cuda(p, args) -> int:
    from .. import _C
    from . import cuda_bench
    from .launch import under_torchrun

    has_cuda = bool(getattr(_C, "has_cuda", False))
    count = torch.cuda.device_count() if has_cuda and torch.cuda.is_available() else 0
    errors = cuda_bench.argument_errors(args, has_cuda, count, under_torchrun())
    if errors:
        p.error("; ".join(errors))
    if args.sim_ranks is not None:
        return cuda_bench.run_simulated(args)
    launch(cuda_bench.run, args.nproc, args, device="cuda")
    return 0


if __name__ == "__main__":
    sys.exit(main())
