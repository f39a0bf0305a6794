"""Every collective against an independent reference, for world sizes 1-5, every dtype and op,
sizes 0, 1, primes and larger than the staging buffer, on the shared-memory path (each all-reduce
algorithm) and on the multi-host paths (host ids forced with RINGZERO_HOST_ID).

Reference: gloo's torch.distributed.all_reduce on the same inputs widened to float64/int64 (exact for
the small integers used here; 8-bit products wrap the same way after narrowing), gloo SUM divided by
the world size for AVG (which gloo lacks), and each rank's known inputs for the data-movement ops.
Integer-valued inputs make every comparison exact; random floats are checked with stated tolerances.
"""
import os

import pytest
import torch
import torch.distributed as dist

import ringzero
from harness import run_ranks
from reference import DTYPES, OPS, SIZES, SMALL_BUFFERS, check_equal, gloo_reference, make

def check_all(rank, world, group, label):
    """Every collective, every dtype, op and size, on `group` (all ranks)."""
    cases = 0
    for dtype in DTYPES:
        for n in SIZES:
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


def single_host_body(rank, world):
    cases = 0
    for algo in ["oneshot", "twoshot", "ring"]:
        os.environ["RINGZERO_ALLREDUCE_ALGO"] = algo
        group = dist.new_group(list(range(world)))
        cases += check_all(rank, world, group, f"shm/{algo}")
    os.environ["RINGZERO_ALLREDUCE_ALGO"] = "auto"
    random_floats_and_async(rank, world, None, "shm/auto")
    return cases


def multi_host_body(rank, world):
    comm = ringzero.get_communicator(dist.group.WORLD)
    mode = "hierarchical" if comm.hierarchical else "flat ring"
    cases = check_all(rank, world, None, mode)
    random_floats_and_async(rank, world, None, mode)
    return mode, cases




@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_single_host_matches_gloo(world):
    cases = run_ranks(world, single_host_body, env=SMALL_BUFFERS)
    assert cases[0] > 0


@pytest.mark.parametrize("hosts,mode", [
    ("a,b", "flat ring"),
    ("a,a,b", "flat ring"),              # uneven hosts
    ("a,a,b,b", "hierarchical"),
    ("a,b,a,b", "hierarchical"),         # a host's ranks are not contiguous
    ("a,b,a,b,a", "flat ring"),
])
def test_multi_host_matches_gloo(hosts, mode):
    world = len(hosts.split(","))
    results = run_ranks(world, multi_host_body, env={**SMALL_BUFFERS, "RINGZERO_HOST_IDS": hosts})
    assert all(m == mode for m, _ in results), results
    assert results[0][1] > 0


def test_default_buffer_streams_large_tensor():
    """A tensor larger than the default 1 MiB staging buffer, with the default settings."""
    def body(rank, world):
        for n in [262_147, 1_000_003]:
            x = make(rank, n, torch.float32)
            want = gloo_reference(x, ringzero.ReduceOp.SUM, world)
            ringzero.all_reduce(x)
            check_equal(x, want, f"default buffer n={n}")
        return True
    assert all(run_ranks(3, body))
