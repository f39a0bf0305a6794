"""Stages 2-3's flat gradient buffer is allocated without zeroing ([Note: the gradient buffer's zeros] in
sharded_group.py): what the reduction reads must still be exact, with the allocator's memory stale. The rank
plants that staleness: while the buffer is allocated, torch.empty hands out NaN-filled memory."""
from __future__ import annotations

import contextlib

import pytest
import torch

from harness import run_ranks


@contextlib.contextmanager
def stale_empty():
    """torch.empty returns NaN-filled float tensors (what a reused heap block may hold), so any element that
    the code reads without writing it first shows up as NaN in the result."""
    real = torch.empty

    def empty(*args, **kwargs):
        t = real(*args, **kwargs)
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    torch.empty = empty
    try:
        yield
    finally:
        torch.empty = real


def reduce_case(rank, world, sizes, skips):
    from ringzero.parallel.data_parallel.flat import FlatLayout
    from ringzero.parallel.data_parallel.sharded_group import GradReduction, ShardedGroup
    results = []
    for skip in skips:
        params = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
        g = ShardedGroup([(f"p{i}", p) for i, p in enumerate(params)], None, world, rank,
                         GradReduction.REDUCE_SCATTER, torch.float32, torch.float32, torch.device("cpu"))
        out = []
        for step in range(2):  # the second backward allocates the buffer again
            with stale_empty():
                for i, p in enumerate(params):
                    if i not in skip:
                        # Integers, so the ranks' average is exact: parameter i holds (i + 1) * (rank + 1).
                        g.copy_grad_in(p, torch.full((sizes[i],), float((i + 1) * (rank + 1))))
                g.reduce_async()
            g.finish_reduce()
            out.append(g.master.grad.clone().tolist())
            g.master.grad = None
        layout = FlatLayout([(f"p{i}", p) for i, p in enumerate(params)], world, rank)
        results.append((out, layout.shard_start, layout.shard_numel, layout.padded_numel))
    return results


@pytest.mark.parametrize("world", [1, 3])
def test_stale_memory_never_reaches_the_reduction(world):
    """Every parameter written: each rank's shard of the average, zeros in the padding. Parameters skipped
    (no copy_grad_in call before reduce_async): zeros for them, never the stale NaN."""
    sizes = [5, 8, 0, 3]  # 16 elements: padding at world 3 (shard 6, padded 18), none at world 1
    skips = [set(), {1}, {0, 3}]
    mean_rank = (world + 1) / 2  # the average of rank + 1 over the ranks
    by_rank = run_ranks(world, reduce_case, sizes, skips)
    for k, skip in enumerate(skips):
        want = []
        for i, n in enumerate(sizes):
            want += [0.0 if i in skip else (i + 1) * mean_rank] * n
        for rank_results in by_rank:
            out, start, shard, padded = rank_results[k]
            full = want + [0.0] * (padded - len(want))
            for step in out:
                assert step == full[start:start + shard], (world, skip, step)
