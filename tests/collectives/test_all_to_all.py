"""All-to-all (even and uneven splits, the list form), gather and scatter through every door: ringzero.*
and init_process_group("ringzero") (a backend group), on one host (shared memory, staged and single copy)
and on forced hosts (the flat exchange and the hierarchical form), world sizes 1-5.

References: each rank's expected output computed from the inputs every rank can rebuild (integer-valued
elements that encode source rank, destination and position, so a misplaced element never matches by
chance), and gloo's own all_to_all_single on the harness's default group for the same inputs, bit for
bit. Randomised cases print their seed.
"""
import os
import random

import pytest
import torch
import torch.distributed as dist

import ringzero
from harness import run_ranks
from reference import SMALL_BUFFERS

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8, torch.uint8, torch.int32,
          torch.int64]


def _value(src: int, dst: int, i: int, dtype) -> int:
    """An element's value: distinct per (source, destination, index) within what every dtype holds exactly."""
    top = 100 if dtype in (torch.int8, torch.uint8) else 250
    return (src * 31 + dst * 7 + i) % top


def _inputs(rank: int, world: int, matrix, row: int, dtype) -> torch.Tensor:
    blocks = [torch.tensor([_value(rank, p, i, dtype) for i in range(matrix[rank][p] * row)], dtype=torch.int64)
              for p in range(world)]
    return torch.cat(blocks).to(dtype).view(-1, row) if row else torch.empty(0, dtype=dtype)


def _expected(rank: int, world: int, matrix, row: int, dtype) -> torch.Tensor:
    blocks = [torch.tensor([_value(q, rank, i, dtype) for i in range(matrix[q][rank] * row)], dtype=torch.int64)
              for q in range(world)]
    return torch.cat(blocks).to(dtype).view(-1, row)


def _matrices(world: int, rng: random.Random):
    """Split matrices (rows, matrix[q][p] from q to p): even, uneven with zero blocks, large blocks (past the
    64 KiB from which one host reads blocks from the peers directly, and below it)."""
    even = [[3] * world for _ in range(world)]
    uneven = [[rng.choice([0, 1, 2, 5, 13, 37]) for _ in range(world)] for _ in range(world)]
    zero_row = [[0 if q == world - 1 else rng.randint(0, 9) for _ in range(world)] for q in range(world)]
    large = [[20011 if (q + p) % 2 else rng.randint(0, 3) for p in range(world)] for q in range(world)]
    medium = [[rng.randint(3000, 5000) for _ in range(world)] for _ in range(world)]
    return [("even", even), ("uneven", uneven), ("a rank sends nothing", zero_row), ("large", large),
            ("medium", medium)]


def _one_all_to_all(rank, world, group, matrix, row, dtype, door):
    inp = _inputs(rank, world, matrix, row, dtype)
    out = torch.full((sum(matrix[q][rank] for q in range(world)), row), 77, dtype=dtype)
    even = all(matrix[q][p] == matrix[0][0] for q in range(world) for p in range(world))
    splits_out = None if even else [matrix[q][rank] for q in range(world)]
    splits_in = None if even else matrix[rank]
    if door == "ringzero":
        ringzero.all_to_all_single(out, inp, splits_out, splits_in, group=group)
    else:
        dist.all_to_all_single(out, inp, splits_out, splits_in, group=group)
    return inp, out, splits_out, splits_in


def all_to_all_body(rank, world, seed, doors):
    rng = random.Random(seed)
    print(f"test_all_to_all seed {seed}", flush=True)
    groups = {"ringzero": dist.new_group(list(range(world)))}
    if "backend" in doors:
        groups["backend"] = dist.new_group(list(range(world)), backend="ringzero")
    cases = 0
    for name, matrix in _matrices(world, rng):
        for dtype in DTYPES:
            row = rng.choice([1, 3]) if dtype != torch.float32 else 1
            for door in doors:
                _, out, _, _ = _one_all_to_all(rank, world, groups[door], matrix, row, dtype, door)
                want = _expected(rank, world, matrix, row, dtype)
                assert torch.equal(out, want), f"{door} {name} {dtype} row {row} seed {seed}: wrong blocks"
                cases += 1
        # Against gloo itself, bit for bit, on random floats (the harness's default group is gloo).
        inp = torch.randn(sum(matrix[rank]), 2, generator=torch.Generator().manual_seed(seed * 10 + rank))
        out_gloo = torch.empty(sum(matrix[q][rank] for q in range(world)), 2)
        splits_out = [matrix[q][rank] for q in range(world)]
        dist.all_to_all_single(out_gloo, inp, splits_out, matrix[rank])
        for door in doors:
            out = torch.empty_like(out_gloo)
            if door == "ringzero":
                ringzero.all_to_all_single(out, inp, splits_out, matrix[rank], group=groups[door])
            else:
                dist.all_to_all_single(out, inp, splits_out, matrix[rank], group=groups[door])
            assert torch.equal(out.view(torch.int32), out_gloo.view(torch.int32)), f"{door} {name}: differs from gloo"
    # The list form, async, and a strided output through the backend.
    sizes = [[rng.randint(0, 6) for _ in range(world)] for _ in range(world)]
    ins = [torch.full((sizes[rank][p],), rank * 10 + p, dtype=torch.int32) for p in range(world)]
    for door in doors:
        outs = [torch.empty(sizes[q][rank], dtype=torch.int32) for q in range(world)]
        fn = ringzero.all_to_all if door == "ringzero" else dist.all_to_all
        work = fn(outs, ins, group=groups[door], async_op=True)
        work.wait()
        for q in range(world):
            assert torch.equal(outs[q], torch.full((sizes[q][rank],), q * 10 + rank, dtype=torch.int32)), (door, q)
    if "backend" in doors:
        base = torch.zeros(2 * world * 4, dtype=torch.int64)
        strided = base[::2]
        dist.all_to_all_single(strided, torch.arange(world * 4, dtype=torch.int64) + rank * 100, group=groups["backend"])
        want = torch.cat([torch.arange(rank * 4, rank * 4 + 4) + q * 100 for q in range(world)])
        assert torch.equal(strided, want) and not base[1::2].any()
    # The api's fast path ([Note: the api's fast path]) takes blocking calls with list splits or none; the
    # others (a tuple of numpy ints, say) take the slow path: the same result either way.
    comm = ringzero.get_communicator(groups["ringzero"])
    if comm.shm_direct:
        x = torch.arange(world * 3, dtype=torch.float64) + 1000 * rank
        fast, slow = torch.empty(world * 3, dtype=torch.float64), torch.empty(world * 3, dtype=torch.float64)
        before = comm.shm.seq
        ringzero.all_to_all_single(fast, x, [3] * world, [3] * world, group=groups["ringzero"])
        assert comm.shm.seq == before + 1
        ringzero.all_to_all_single(slow, x, torch.tensor([3] * world), torch.tensor([3] * world),
                                   group=groups["ringzero"])
        assert torch.equal(fast, slow)
    # ringzero.patch(): torch's own call on a gloo group takes ringzero's path.
    comm = ringzero.get_communicator(groups["ringzero"])
    before = comm.seq
    out = torch.empty(world * 2)
    with ringzero.patch():
        dist.all_to_all_single(out, torch.arange(world * 2, dtype=torch.float32) + 10 * rank, group=groups["ringzero"])
    assert comm.seq == before + 1
    assert torch.equal(out, torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32) + 10 * q
                                       for q in range(world)]))
    direct = comm.shm.single_copy_calls if comm.shm is not None and comm.single_host else None
    return cases, direct


def gather_scatter_body(rank, world, doors):
    groups = {"ringzero": dist.new_group(list(range(world)))}
    if "backend" in doors:
        groups["backend"] = dist.new_group(list(range(world)), backend="ringzero")
    for door in doors:
        g = groups[door]
        gather = ringzero.gather if door == "ringzero" else dist.gather
        scatter = ringzero.scatter if door == "ringzero" else dist.scatter
        for count in [0, 1, 7, 4099]:
            for root in range(world):
                mine = torch.arange(count, dtype=torch.int64) + rank * 100000
                got = [torch.full((count,), -1, dtype=torch.int64) for _ in range(world)] if rank == root else None
                gather(mine, got, dst=root, group=g)
                if rank == root:
                    for q in range(world):
                        assert torch.equal(got[q], torch.arange(count) + q * 100000), (door, count, root, q)
                blocks = [torch.arange(count, dtype=torch.float32) + q * 1000 + root for q in range(world)]
                out = torch.full((count,), -1.0)
                scatter(out, blocks if rank == root else None, src=root, group=g)
                assert torch.equal(out, torch.arange(count, dtype=torch.float32) + rank * 1000 + root), (door, count)
        # Blocks of two dimensions (across hosts the root's list goes to the transport as it is, each block flat).
        root = world - 1
        got = [torch.full((3, 5), -1, dtype=torch.int64) for _ in range(world)] if rank == root else None
        gather(torch.arange(15, dtype=torch.int64).view(3, 5) + rank * 100, got, dst=root, group=g)
        if rank == root:
            assert all(torch.equal(t, torch.arange(15).view(3, 5) + q * 100) for q, t in enumerate(got)), door
        out = torch.full((3, 5), -1.0)
        scatter(out, [torch.arange(15, dtype=torch.float32).view(3, 5) + q for q in range(world)] if rank == root else None,
                src=root, group=g)
        assert torch.equal(out, torch.arange(15, dtype=torch.float32).view(3, 5) + rank), door
    if "backend" in doors:
        stats = ringzero.backend_stats(groups["backend"])
        for op in ("alltoall_base", "alltoall", "gather", "scatter"):
            assert op not in stats["fallback"], stats
    return True


def mismatch_body(rank, world):
    """Ranks whose split sizes disagree: every rank raises CollectiveMismatch naming the pair, and the group
    still works afterwards."""
    for door, g in (("ringzero", dist.new_group(list(range(world)))),
                    ("backend", dist.new_group(list(range(world)), backend="ringzero"))):
        send = [2] * world
        recv = [2] * world
        if rank == 0:
            send[1] = 3  # rank 0 sends 3 to rank 1, which expects 2
        inp, out = torch.zeros(sum(send)), torch.zeros(sum(recv))
        fn = ringzero.all_to_all_single if door == "ringzero" else dist.all_to_all_single
        with pytest.raises(Exception, match="sends 3 elements to group rank 1, which expects 2"):
            fn(out, inp, recv, send, group=g)
        inp = torch.arange(world * 2, dtype=torch.float32) + rank
        out = torch.zeros(world * 2)
        fn(out, inp, group=g)
        assert torch.equal(out, torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32) + q
                                           for q in range(world)]))
    return True


def bad_args_body(rank, world):
    g = dist.new_group(list(range(world)))
    x = torch.zeros(world * 2)
    with pytest.raises(ValueError, match="input_split_sizes .* sums to"):
        ringzero.all_to_all_single(torch.zeros(world * 2), x, None, [1] * world, group=g)
    with pytest.raises(ValueError, match="must hold 2 non-negative sizes"):
        ringzero.all_to_all_single(torch.zeros(world * 2), x, [world * 2], None, group=g)
    with pytest.raises(ValueError, match="not divisible by the world size"):
        ringzero.all_to_all_single(torch.zeros(3), torch.zeros(3), group=g)
    with pytest.raises(ValueError, match="must not overlap"):
        ringzero.all_to_all_single(x, x, group=g)
    with pytest.raises(TypeError, match="dtype"):
        ringzero.all_to_all_single(torch.zeros(world * 2, dtype=torch.int32), x, group=g)
    # Checked before any message moves, so one rank alone may get them wrong.
    if rank == 1:
        with pytest.raises(ValueError, match="gather_list must be None on rank 1"):
            ringzero.gather(x, [x, x], dst=0, group=g)
    else:
        with pytest.raises(ValueError, match="scatter_list on the root must hold world_size = 2"):
            ringzero.scatter(x, [x], src=0, group=g)
    return True


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_one_host(world):
    seed = random.randrange(1 << 30)
    results = run_ranks(world, all_to_all_body, seed, ("ringzero", "backend"), env=SMALL_BUFFERS)
    assert results[0][0] > 0, f"seed {seed}"
    if world > 1:  # the large blocks took single copy (where the kernel allows it, as on these machines)
        assert all(direct > 0 for _, direct in results), results
    run_ranks(world, gather_scatter_body, ("ringzero", "backend"), env=SMALL_BUFFERS)


def test_one_host_staged_only():
    """RINGZERO_SINGLE_COPY=0: every block through the slots (the default reads large blocks directly)."""
    seed = random.randrange(1 << 30)
    results = run_ranks(4, all_to_all_body, seed, ("ringzero",), env={**SMALL_BUFFERS, "RINGZERO_SINGLE_COPY": "0"})
    assert all(direct == 0 for _, direct in results), results


@pytest.mark.parametrize("hosts", ["a,b", "a,a,b", "a,a,b,b", "a,b,a,b", "a,b,a,b,a"])
def test_hosts(hosts):
    world = len(hosts.split(","))
    seed = random.randrange(1 << 30)
    env = {**SMALL_BUFFERS, "RINGZERO_HOST_IDS": hosts}
    run_ranks(world, all_to_all_body, seed, ("ringzero", "backend"), env=env)
    run_ranks(world, gather_scatter_body, ("ringzero", "backend"), env=env)


@pytest.mark.parametrize("hosts", [None, "a,a,b,b"])
def test_mismatched_splits_raise(hosts):
    env = {**SMALL_BUFFERS, "RINGZERO_TIMEOUT_S": "20"}
    if hosts:
        env["RINGZERO_HOST_IDS"] = hosts
    run_ranks(4 if hosts else 3, mismatch_body, env=env)


def test_bad_arguments():
    run_ranks(2, bad_args_body, env=SMALL_BUFFERS)
