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


def _direct_refusals(rank, world):
    """The native entry (csrc/torch/shm_direct.cpp) returns False, having done nothing, for every argument
    it does not take: called on one rank only, none of them may synchronise (or the next collective,
    checked against its known result, would hang or mismatch). The api then takes its slow path."""
    comm = get_communicator(dist.group.WORLD)
    x = torch.full((4,), float(rank + 1))
    ringzero.all_reduce(x)
    direct_ar, direct_rs, direct_ag = comm.shm_all_reduce_, comm.shm_reduce_scatter, comm.shm_all_gather
    SUM = ringzero.ReduceOp.SUM
    f32, i64 = torch.ones(world * 4), torch.ones(world * 4, dtype=torch.int64)

    class Sub(torch.Tensor):
        pass

    if rank == 0:
        refused = [
            direct_ar(f32, 0, comm.algo),                        # a plain int op: only ringzero.ReduceOp
            direct_ar(f32, dist.ReduceOp.SUM, comm.algo),        # torch's ops go through to_reduce_op
            direct_ar(f32, SUM, -1),                             # algo out of range
            direct_ar(f32.view(4, world).t(), SUM, comm.algo),   # not contiguous
            direct_ar(f32.as_subclass(Sub), SUM, comm.algo),     # a subclass (may define __torch_function__)
            direct_ar(torch.ones(4, dtype=torch.complex64), SUM, comm.algo),  # a dtype the kernels lack
            direct_ar(torch.ones(4, device="meta"), SUM, comm.algo),          # not a CPU tensor
            direct_ar(f32.to_sparse(), SUM, comm.algo),          # not strided
            direct_ar([1.0], SUM, comm.algo),                    # not a tensor
            direct_ag(f32[:4], f32[:world * 4 - 1]),             # output size
            direct_ag(f32[:4], i64),                             # dtypes differ
            direct_rs(f32, f32[:4], SUM),                        # output overlaps input
            direct_rs(f32, torch.empty(5), SUM),                 # sizes
            direct_rs(f32, torch.empty(4), 1),                   # plain int op
        ]
        assert refused == [False] * len(refused), refused
        with pytest.raises(TypeError, match="takes 3 arguments"):
            direct_ar(f32, SUM)
    seq = comm.seq
    assert direct_ar(x, SUM, comm.algo) is True  # taken: runs on every rank, in step after the refusals
    assert torch.equal(x, torch.full((4,), float(world * world * (world + 1) / 2)))
    assert comm.seq == seq  # the raw entry does not count; the api does, once per call
    y = torch.nn.Parameter(torch.full((3,), float(rank)), requires_grad=False)
    ringzero.all_reduce(y)  # a Parameter is a plain tensor to C++: the fast path takes it
    assert torch.equal(y.data, torch.full((3,), float(sum(range(world)))))
    ringzero.all_reduce(y, op=dist.ReduceOp.MAX)  # torch's op: the slow path, same result
    assert torch.equal(y.data, torch.full((3,), float(sum(range(world)))))
    assert comm.seq == seq + 2
    with pytest.raises(TypeError):
        ringzero._C.ShmDirect()  # made only by _C.shm_direct(shm), which keeps its ShmComm alive
    return True


@pytest.mark.parametrize("world", [2, 3])
def test_direct_entry_refuses_without_synchronising(world):
    assert run_ranks(world, _direct_refusals, timeout_s=300) == [True] * world


def _large_all_gather(rank, world):
    """Two-rank all-gathers of 8 MiB and more per rank (the selector's single_copy_end_bytes) run a cache-placement probe after their first slice
    and may stage the rest with streaming stores (csrc/core/shm_placement.cpp, [Note: where the host runs the
    ranks' cores]): whichever way the probe decides, the result must equal the known integers, in place
    (input = this rank's block of the output) or not, blocking or async; each such call runs exactly one
    probe on every rank, smaller ones none."""
    comm = get_communicator(dist.group.WORLD)
    per = (8 << 20) // 4 + 4099  # past the threshold, not a multiple of the 256 KiB slot
    want = torch.cat([torch.arange(per, dtype=torch.int32) * 3 + q for q in range(world)])
    shm = comm.shm
    probes = shm.probes
    out = torch.empty(world * per, dtype=torch.int32)
    ringzero.all_gather_single(out, torch.arange(per, dtype=torch.int32) * 3 + rank)
    assert torch.equal(out, want)
    assert shm.probes == probes + 1 and shm.probe_ns > 0
    out2 = torch.zeros(world * per, dtype=torch.int32)
    out2[rank * per:(rank + 1) * per] = torch.arange(per, dtype=torch.int32) * 3 + rank
    ringzero.all_gather_single(out2, out2[rank * per:(rank + 1) * per])  # in place
    assert torch.equal(out2, want)
    out3 = torch.empty(world * per, dtype=torch.int32)
    ringzero.all_gather_single(out3, torch.arange(per, dtype=torch.int32) * 3 + rank, async_op=True).wait()
    assert torch.equal(out3, want)
    small = torch.empty(world * 1000, dtype=torch.int32)
    ringzero.all_gather_single(small, torch.full((1000,), rank, dtype=torch.int32))
    assert small.tolist() == [q for q in range(world) for _ in range(1000)]
    assert shm.probes == probes + 3  # the 4 KB call ran none
    return shm.probe_ns


def test_large_two_rank_all_gather_probes_and_stays_exact():
    ns = run_ranks(2, _large_all_gather, timeout_s=300)
    print(f"probe round trips (ns) per rank: {ns}")
    assert all(x > 0 for x in ns)


def _staging_streams(rank, world):
    """Two ranks on two last-level caches stage all-reduces and reduce-scatters of 64 KiB and more with
    streaming stores (csrc/core/shm_collectives.cpp, [Note: where the host runs the ranks' cores]); the store
    type must never change a result. Each mode (never, always, by the probe) runs the one-shot (64 KiB), the
    two-shot (one slot, several slots and an odd tail) and the staged reduce-scatter on known integers, and
    the placement is probed at the first call of 64 KiB and more, then again after 32 such calls or 64 MiB,
    whatever the mode (a rank's own), on both ranks alike; smaller calls never probe."""
    shm = get_communicator(dist.group.WORLD).shm
    sizes = [(64 << 10) // 4, (256 << 10) // 4 + 1, (3 << 20) // 4 + 4099, 7]
    seen = []
    for mode in (1, 0, 2):
        shm.set_stage_streaming(mode)
        for n in sizes:
            x = (torch.arange(n, dtype=torch.int32) % 1009) * (rank + 1)
            ringzero.all_reduce(x)
            assert torch.equal(x, (torch.arange(n, dtype=torch.int32) % 1009) * 3), (mode, n)
            inp = torch.arange(2 * n, dtype=torch.int32) % 997 + rank
            out = torch.empty(n, dtype=torch.int32)
            ringzero.reduce_scatter_single(out, inp)
            want = (torch.arange(2 * n, dtype=torch.int32) % 997)[rank * n:(rank + 1) * n] * 2 + 1
            assert torch.equal(out, want), (mode, n)
        seen.append(shm.probes)
    probes = shm.probes
    for i in range(64):  # 64 calls of 64 KiB: a probe every 32nd; 64 of 4 KB: none
        ringzero.all_reduce(torch.ones((64 << 10) // 4))
        ringzero.all_reduce(torch.ones(1000))
    small = shm.probes - probes
    for i in range(6):  # 32 MiB calls: a probe once 64 MiB have run since the last (the 3rd and 5th)
        ringzero.all_reduce(torch.ones((32 << 20) // 4))
    large = shm.probes - probes - small
    shm.set_stage_streaming(rank)  # the ranks' own choices differ: rank 0 never streams, rank 1 always
    for n in sizes:
        x = (torch.arange(n, dtype=torch.int32) % 1009) * (rank + 1)
        ringzero.all_reduce(x)
        assert torch.equal(x, (torch.arange(n, dtype=torch.int32) % 1009) * 3), ("mixed", n)
    shm.set_stage_streaming(2)
    with pytest.raises(Exception, match="mode must be 0"):
        shm.set_stage_streaming(3)
    return seen, small, large, shm.stage_other_cache


def test_staging_streams_on_two_caches_and_stays_exact():
    res = run_ranks(2, _staging_streams, timeout_s=300)
    print(f"probes after modes always/never/probe, in 128 small calls, in 6 large ones, last verdict: {res}")
    for seen, small, large, _ in res:
        assert seen == [1, 1, 1], seen  # the first call of 64 KiB probed; 18 calls and 30 MiB since
        assert small == 2, small
        assert large == 2, large
    assert res[0][:3] == res[1][:3], "the ranks probed at different calls"
