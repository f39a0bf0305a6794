"""The collective cases the tests share (run by every rank of a group; never imported from a test file):
every collective, dtype, op and size against gloo and each rank's known inputs (check_all), random
floats against a float64 gloo reference and the async handles (random_floats_and_async). Used by
tests/collectives/test_collectives.py (one host, forced host ids) and tests/helpers/run_hostlab_rank.py (namespaced hosts).
"""
import torch
import torch.distributed as dist

import ringzero
from reference import DTYPES, OPS, SIZES, check_equal, gloo_reference, make


def check_all(rank, world, group, label, sizes=SIZES):
    """Every collective, every dtype, op and size (of `sizes`), on `group` (every rank calls it); returns
    the number of cases checked."""
    cases = 0
    for dtype in DTYPES:
        for n in sizes:
            tag = f"{label} {dtype} n={n}"
            x = make(rank, n, dtype)
            for op in OPS:
                want = gloo_reference(x, op, world)
                got = x.clone()
                ringzero.all_reduce(got, op=op, group=group)
                check_equal(got, want, f"{tag} all_reduce {op.name}")

                dst = n % world
                got = x.clone()
                ringzero.reduce(got, dst=dst, op=op, group=group)
                check_equal(got, want if rank == dst else x, f"{tag} reduce {op.name} dst={dst}")

                big = make(rank, n * world, dtype, salt=1)
                out = torch.full((n,), 7, dtype=dtype)
                before = big.clone()
                ringzero.reduce_scatter_single(out, big, op=op, group=group)
                check_equal(out, gloo_reference(big, op, world)[rank * n:(rank + 1) * n], f"{tag} reduce_scatter {op.name}")
                check_equal(big, before, f"{tag} reduce_scatter leaves its input alone")
                cases += 3

            out = torch.empty(n * world, dtype=dtype)
            ringzero.all_gather_into_tensor(out, x, group=group)
            check_equal(out, torch.cat([make(q, n, dtype) for q in range(world)]), f"{tag} all_gather")

            counts = [(n * (q + 1)) // world + q for q in range(world)]
            mine = make(rank, counts[rank], dtype, salt=2)
            out = torch.empty(sum(counts), dtype=dtype)
            ringzero.all_gather_v(out, mine, counts, group=group)
            check_equal(out, torch.cat([make(q, counts[q], dtype, salt=2) for q in range(world)]), f"{tag} all_gather_v")

            src = (n + 1) % world
            buf = make(rank, n, dtype, salt=3) if rank == src else torch.zeros(n, dtype=dtype)
            ringzero.broadcast(buf, src=src, group=group)
            check_equal(buf, make(src, n, dtype, salt=3), f"{tag} broadcast src={src}")
            ringzero.barrier(group=group)
            cases += 4
    return cases


def random_floats_and_async(rank, world, group, label):
    """Random float inputs against a float64 gloo reference, and the async_op handles."""
    g = torch.Generator().manual_seed(1234 + rank)
    for dtype, rtol in [(torch.float32, 1e-6 * world), (torch.bfloat16, 2 ** -8 * world), (torch.float16, 2 ** -11 * world)]:
        for n in [1, 977, 300_007]:
            x = torch.randn(n, generator=g).to(dtype)
            ref = x.double()
            dist.all_reduce(ref)
            got = x.clone()
            ringzero.all_reduce(got, group=group)
            # Stated tolerance: one rounding per ring step of the result's magnitude, world steps at most.
            torch.testing.assert_close(got.double(), ref.to(dtype).double(), rtol=rtol, atol=rtol * ref.abs().max().item(),
                                       msg=lambda m: f"{label} {dtype} n={n}: {m}")
    # async_op: handles complete in call order and wait() returns True.
    xs = [make(rank, 1000 + k, torch.int64) for k in range(4)]
    works = [ringzero.all_reduce(x, group=group, async_op=True) for x in xs]
    assert all(w.wait() for w in works) and all(w.is_completed() for w in works)
    for k, x in enumerate(xs):
        check_equal(x, gloo_reference(make(rank, 1000 + k, torch.int64), ringzero.ReduceOp.SUM, world), f"{label} async {k}")
    fut = ringzero.barrier(group=group, async_op=True).get_future()
    fut.wait()
    # A 2-D tensor keeps its shape.
    m = make(rank, 60, torch.float32).view(6, 10)
    ringzero.all_reduce(m, group=group)
    assert m.shape == (6, 10)
    check_equal(m.flatten(), gloo_reference(make(rank, 60, torch.float32), ringzero.ReduceOp.SUM, world), f"{label} 2-D")
