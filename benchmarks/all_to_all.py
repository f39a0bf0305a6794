"""All-to-all on one host, ringzero through each door against gloo's own call, interleaved rounds.

    python benchmarks/all_to_all.py --nproc 2 --rounds 5
    python benchmarks/all_to_all.py --nproc 4 --rounds 5 --sizes 64K,1M,16M

Each rank's input of SIZE bytes (float32) goes out in world blocks: even (SIZE/world each) or uneven
(rank r sends rank p a share proportional to 1 + (r + 2p) mod world, rounded to whole elements). Three
calls of torch's signature on the same tensors: `ringzero.all_to_all_single` on the default (gloo) group,
the ringzero door; `dist.all_to_all_single` on a group made with backend="ringzero", the backend door;
and `dist.all_to_all_single` on the gloo group itself, the baseline. Every round times each of them at
every size (ringzero.timing.time_calls: the slowest rank's mean per call), the order of the three rotating
from round to round; the table gives each one's median over the rounds with its range, the ratio gloo /
ringzero of the medians (above 1: ringzero faster), and floor%: the time no algorithm can beat (each rank
reads its input and writes its output once, at the streaming bandwidth of that working set measured in the
same run: ringzero.cli.bench.stream_bandwidth), over ringzero's median. Before timing, each door's output is
checked equal, bit for bit, to gloo's.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch
import torch.distributed as dist

from ringzero.cli.bench import _max_over_ranks, human, parse_size, stream_bandwidth
from ringzero.cli.launch import launch
from ringzero.timing import time_calls

DOORS = ("ringzero.*", "backend", "gloo")


def splits(world: int, numel: int, uneven: bool) -> list[list[int]]:
    """matrix[r][p]: elements rank r sends rank p; every row sums to numel."""
    if not uneven:
        return [[numel // world] * world for _ in range(world)]
    matrix = []
    for r in range(world):
        weights = [1 + (r + 2 * p) % world for p in range(world)]
        row = [numel * w // sum(weights) for w in weights]
        row[-1] += numel - sum(row)
        matrix.append(row)
    return matrix


def run(args):
    import ringzero

    rank, world = dist.get_rank(), dist.get_world_size()
    rz = dist.new_group(list(range(world)), backend="ringzero")
    rows = []
    for uneven in (False, True):
        for size in args.sizes:
            numel = size // 4 // world * world
            m = splits(world, numel, uneven)
            send, recv = m[rank], [m[q][rank] for q in range(world)]
            inp = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
            outs = {d: torch.empty(sum(recv)) for d in DOORS}
            calls = {
                "ringzero.*": lambda o=outs["ringzero.*"]: ringzero.all_to_all_single(o, inp, recv, send),
                "backend": lambda o=outs["backend"]: dist.all_to_all_single(o, inp, recv, send, group=rz),
                "gloo": lambda o=outs["gloo"]: dist.all_to_all_single(o, inp, recv, send),
            }
            for d in DOORS:
                calls[d]()
            for d in DOORS[:2]:
                if not torch.equal(outs[d].view(torch.int32), outs["gloo"].view(torch.int32)):
                    raise SystemExit(f"rank {rank}: {d} differs from gloo at {size} bytes (uneven={uneven})")
            times = {d: [] for d in DOORS}
            bw = 0.0
            for r in range(args.rounds):
                order = DOORS[r % 3:] + DOORS[:r % 3]
                for d in order:
                    sync = dist.barrier
                    times[d].append(time_calls(calls[d], sync, _max_over_ranks, args.budget_s))
                bw = max(bw, stream_bandwidth(2 * numel * 4, 0.05))
            rows.append((uneven, size, times, bw))
    if rank == 0:
        print(f"# all_to_all_single, float32, {world} ranks on one host, {args.rounds} interleaved rounds; "
              "time: median us per call [fastest-slowest round]; ratio = gloo median / ringzero median")
        print(f"{'splits':>7} {'size':>6} | {'ringzero.*':>22} | {'backend door':>22} | {'gloo':>22} | "
              f"{'ratio .*':>8} {'ratio be':>8} | {'floor%':>6}")
        for uneven, size, times, bw in rows:
            med = {d: statistics.median(t) for d, t in times.items()}
            cell = lambda d: f"{med[d] * 1e6:9.1f} [{min(times[d]) * 1e6:.0f}-{max(times[d]) * 1e6:.0f}]"  # noqa: E731
            floor = (2 * size / bw) / med["ringzero.*"] if bw else float("nan")
            print(f"{'uneven' if uneven else 'even':>7} {human(size):>6} | {cell('ringzero.*'):>22} | "
                  f"{cell('backend'):>22} | {cell('gloo'):>22} | {med['gloo'] / med['ringzero.*']:>7.2f}x "
                  f"{med['gloo'] / med['backend']:>7.2f}x | {100 * floor:>5.0f}%", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--sizes", default="64K,256K,1M,4M,16M,64M",
                   help="bytes of each rank's input, comma-separated")
    p.add_argument("--budget-s", type=float, default=0.2, help="seconds of timed calls per door, size and round")
    args = p.parse_args(argv)
    args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    launch(run, args.nproc, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
