"""Soak: thousands of collectives of random kind, dtype, reduce op and size on every rank, each result
checked against a reference computed locally (every rank's input is a known function of the step and
the rank), with resident memory and open file descriptors compared between the start and the end.

    python benchmarks/soak.py --nproc 4 --steps 20000 --max-seconds 900
    RINGZERO_HOST_ID-style multi-host runs: --hosts a,b,a,b

tests/collectives/test_soak.py runs a bounded version of the same body in CI.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import random
import sys
import time

import torch
import torch.distributed as dist

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8, torch.uint8, torch.int32,
          torch.int64]
KINDS = ["all_reduce", "reduce_scatter", "all_gather", "all_gather_v", "broadcast", "reduce", "barrier"]


def _rss_bytes() -> int:
    """Resident bytes, after glibc has handed its free heap pages back (malloc_trim). The random sizes up
    to 16 MB leave freed chunks in the threads' arenas; untrimmed, the growth after warm-up measured what
    the allocator kept, 4-70 MiB from run to run on 4 ranks (2026-11-27), not what the collectives hold.
    Trimmed it is 0.3-0.6 MiB."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _size(rng: random.Random) -> int:
    # Mostly small (latency paths), some around the staging buffer, a few large ones.
    r = rng.random()
    if r < 0.6:
        return rng.randint(0, 2048)
    if r < 0.95:
        return rng.randint(2048, 300_000)
    return rng.randint(300_000, 2_000_000)


def _base(seed: int, step: int, n: int, dtype) -> torch.Tensor:
    """Shared per-step values in [0, 3): small, so sums and averages stay exact in every dtype."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, 3, (n,), generator=g).to(dtype)


def _expected_reduce(base: torch.Tensor, world: int, op) -> torch.Tensor:
    """The reduction over ranks of (base + rank) (PRODUCT: of base, the same on every rank)."""
    import ringzero

    wide = base.to(torch.float64 if base.dtype.is_floating_point else torch.int64)
    if op == ringzero.ReduceOp.SUM:
        out = wide * world + world * (world - 1) // 2
    elif op == ringzero.ReduceOp.AVG:
        total = wide * world + world * (world - 1) // 2
        out = total / world if wide.dtype.is_floating_point else torch.div(total, world, rounding_mode="trunc")
    elif op == ringzero.ReduceOp.MIN:
        out = wide
    elif op == ringzero.ReduceOp.MAX:
        out = wide + world - 1
    else:
        out = wide ** world
    return out.to(base.dtype)


def _input(base, rank, op):
    import ringzero

    return base.clone() if op == ringzero.ReduceOp.PRODUCT else base + rank


def soak_body(rank: int, world: int, steps: int, max_seconds: float, seed: int = 0, warmup: int = 200) -> dict:
    """Runs up to `steps` random collectives (same sequence on every rank) and checks each result.
    Returns counts and the memory / descriptor growth between the end of warm-up and the end."""
    import ringzero

    ops = list(ringzero.ReduceOp)
    rng = random.Random(seed)
    start = time.monotonic()
    rss0 = fds0 = None
    done = 0
    for step in range(steps):
        if step == warmup:
            rss0, fds0 = _rss_bytes(), _fds()
        kind, dtype, op, n = rng.choice(KINDS), rng.choice(DTYPES), rng.choice(ops), _size(rng)
        root = rng.randrange(world)
        base = _base(seed, step, n, dtype)
        what = f"step {step}: {kind} {dtype} n={n} op={op.name} root={root}"
        if kind == "all_reduce":
            x = _input(base, rank, op)
            ringzero.all_reduce(x, op=op)
            ok = torch.equal(x, _expected_reduce(base, world, op))
        elif kind == "reduce":
            x = _input(base, rank, op)
            ringzero.reduce(x, dst=root, op=op)
            ok = torch.equal(x, _expected_reduce(base, world, op) if rank == root else _input(base, rank, op))
        elif kind == "reduce_scatter":
            per = n // world
            big = _input(base[: per * world], rank, op)
            out = torch.empty(per, dtype=dtype)
            ringzero.reduce_scatter_single(out, big, op=op)
            ok = torch.equal(out, _expected_reduce(base[rank * per:(rank + 1) * per], world, op))
        elif kind == "all_gather":
            per = n // world
            out = torch.empty(per * world, dtype=dtype)
            ringzero.all_gather_single(out, base[:per] + rank)
            ok = torch.equal(out, torch.cat([base[:per] + q for q in range(world)]))
        elif kind == "all_gather_v":
            counts = [rng.randint(0, max(1, n // world)) for _ in range(world)]
            out = torch.empty(sum(counts), dtype=dtype)
            ringzero.all_gather_v(out, base[: counts[rank]] + rank, counts)
            ok = torch.equal(out, torch.cat([base[: counts[q]] + q for q in range(world)]))
        elif kind == "broadcast":
            x = base + root if rank == root else torch.zeros(n, dtype=dtype)
            ringzero.broadcast(x, src=root)
            ok = torch.equal(x, base + root)
        else:
            ringzero.barrier()
            ok = True
        if not ok:
            raise AssertionError(f"rank {rank}: wrong result at {what}")
        done += 1
        # Stop together: rank 0 decides, everyone learns it through one of our own collectives.
        if step % 100 == 99:
            flag = torch.tensor([1 if rank == 0 and time.monotonic() - start > max_seconds else 0], dtype=torch.int32)
            ringzero.all_reduce(flag, op=ringzero.ReduceOp.MAX)
            if flag.item():
                break
    seconds = time.monotonic() - start
    rss_growth = (_rss_bytes() - rss0) if rss0 is not None else 0
    fd_growth = (_fds() - fds0) if fds0 is not None else 0
    # No rank leaves before every rank has counted: a rank that returns tears its process group down, and
    # gloo then closes the far ends of its sockets in the ranks still counting (a false -1 per peer).
    ringzero.barrier()
    return {"collectives": done, "seconds": seconds, "rss_growth_bytes": rss_growth, "fd_growth": fd_growth}


def _main_rank(args):
    rank, world = dist.get_rank(), dist.get_world_size()
    result = soak_body(rank, world, args.steps, args.max_seconds, args.seed)
    results = [None] * world
    dist.all_gather_object(results, result)
    if rank == 0:
        print(f"soak: {world} ranks, hosts {os.environ.get('RINGZERO_HOST_IDS', 'one')}")
        for r, res in enumerate(results):
            print(f"  rank {r}: {res['collectives']} collectives checked in {res['seconds']:.1f} s, "
                  f"RSS growth {res['rss_growth_bytes'] / 2**20:.1f} MiB, fd growth {res['fd_growth']}")


def main(argv=None):
    p = argparse.ArgumentParser(description="ringzero soak test")
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--max-seconds", type=float, default=900)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hosts", default=None, help="comma-separated host ids per rank (forces the multi-host path)")
    args = p.parse_args(argv)
    if args.hosts:
        ids = args.hosts.split(",")
        if len(ids) != args.nproc:
            p.error(f"--hosts needs {args.nproc} ids, got {len(ids)}")
        os.environ["RINGZERO_HOST_IDS"] = args.hosts
    from ringzero.cli.launch import launch

    launch(_soak_entry, args.nproc, args)


def _soak_entry(args):
    ids = os.environ.get("RINGZERO_HOST_IDS")
    if ids:
        os.environ["RINGZERO_HOST_ID"] = ids.split(",")[dist.get_rank()]
    _main_rank(args)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
