"""How every ringzero benchmark times a call: `ringzero bench` (bench.py), its CUDA tables (cuda_bench.py)
and benchmarks/mpi_anchor.py for Open MPI and MPICH, so their numbers are measured the same way."""
from __future__ import annotations

import time


def time_calls(call, sync, max_over_ranks, budget_s: float, settle=None, most: int = 100_000) -> float:
    """Seconds per call, the method every ringzero benchmark (and benchmarks/mpi_anchor.py for Open MPI
    and MPICH) uses: warm up, pick an iteration count that fills budget_s (the same on all ranks: the
    slowest rank's estimate), then time the loop between two `sync()`s and take the slowest rank's mean.
    `max_over_ranks(x)` returns the largest x over the ranks. `settle()`, where calls only enqueue work
    (CUDA), waits for it: after the estimating call and after the loop, inside the timing."""
    settle = settle or (lambda: None)
    call()
    sync()
    t0 = time.perf_counter()
    call()
    settle()
    one = max_over_ranks(time.perf_counter() - t0)
    iters = int(min(most, max(3, budget_s / max(one, 1e-7))))
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    settle()
    return max_over_ranks((time.perf_counter() - t0) / iters)
