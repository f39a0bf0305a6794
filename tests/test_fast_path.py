"""The api's fast path (blocking all_reduce, reduce_scatter_single and all_gather_single on a one-host
group call the shared-memory communicator directly, comm/api.py): it gives the same results as the slow
path, is recorded by the communicator's own history (which the flight recorder dumps), counts towards
comm_seconds, and bad arguments still get the api's own error messages, with the communicator left in
step (the native checks refuse before any rank synchronises).

References: the known sums of integer-valued inputs; the slow path's messages (async_op=True takes it).
"""
import pytest
import torch
import torch.distributed as dist

import ringzero
from harness import run_ranks
from ringzero.comm.communicator import get_communicator


def _fast_path_cases(rank, world):
    comm = get_communicator(dist.group.WORLD)
    x = torch.full((7,), float(rank + 1))
    ringzero.all_reduce(x)
    total = world * (world + 1) / 2
    assert torch.equal(x, torch.full((7,), total))
    python_entries = len(comm.flight.entries)
    before_s = ringzero.comm_seconds()

    # The fast path: nothing in the Python recorder, everything in the communicator's history.
    big = torch.arange(world * 5, dtype=torch.int64) + rank
    small = torch.empty(5, dtype=torch.int64)
    ringzero.reduce_scatter_single(small, big)
    want = torch.arange(rank * 5, rank * 5 + 5, dtype=torch.int64) * world + sum(range(world))
    assert torch.equal(small, want), (small, want)
    gathered = torch.empty(world * 3, dtype=torch.int32)
    ringzero.all_gather_single(gathered, torch.full((3,), rank, dtype=torch.int32))
    assert gathered.tolist() == [q for q in range(world) for _ in range(3)]
    ringzero.all_reduce(x, op=ringzero.ReduceOp.MAX)
    assert len(comm.flight.entries) == python_entries
    history = comm.shm.history()
    assert [(h[1], h[2], h[3], h[6]) for h in history[-3:]] == [
        ("reduce_scatter", "int64", 5, "ok"), ("all_gather", "int32", 3, "ok"), ("all_reduce", "float32", 7, "ok")]
    assert ringzero.comm_seconds() > before_s

    # The same calls with async_op take run(), recorded in Python.
    ringzero.all_reduce(x, async_op=True).wait()
    assert len(comm.flight.entries) == python_entries + 1

    # Bad arguments: the api's messages, and the ranks stay in step afterwards.
    with pytest.raises(ValueError, match="must not alias input"):
        ringzero.reduce_scatter_single(big[:5], big)
    with pytest.raises(ValueError, match="world_size \\* input_tensor.numel"):
        ringzero.all_gather_single(torch.empty(world * 3 + 1, dtype=torch.int32), torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="must be contiguous"):
        ringzero.all_reduce(torch.ones(4, 2).t())
    with pytest.raises(TypeError, match="dtype"):
        ringzero.reduce_scatter_single(torch.empty(5), big)
    y = torch.full((3,), float(rank))
    ringzero.all_reduce(y)
    assert torch.equal(y, torch.full((3,), float(sum(range(world)))))

    # Passing the group explicitly finds the same communicator.
    ringzero.all_reduce(y, group=dist.group.WORLD)
    assert torch.equal(y, torch.full((3,), float(world * sum(range(world)))))
    return True


@pytest.mark.parametrize("world", [2, 3])
def test_fast_path_results_records_and_errors(world):
    assert run_ranks(world, _fast_path_cases, timeout_s=300) == [True] * world
