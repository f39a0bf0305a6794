"""Bad input and failures: each bad call raises the documented exception with a message naming the
argument; a rank that never arrives or dies makes the others raise CommTimeout within the timeout;
ranks that call different collectives all raise CollectiveMismatch. The reference for "it still works
afterwards" is gloo's all_reduce of the same tensor.
"""
import os
import signal
import threading
import time

import pytest
import torch
import torch.distributed as dist

import ringzero
from harness import run_ranks


def test_call_before_init_process_group():
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="init_process_group"):
        ringzero.all_reduce(torch.ones(3))
    with pytest.raises(ValueError, match="init_process_group"):
        ringzero.barrier()


def expect(exc, pattern, fn, *args, **kwargs):
    with pytest.raises(exc, match=pattern):
        fn(*args, **kwargs)


def bad_inputs_body(rank, world):
    t = torch.ones(8)
    out = torch.empty(8 * world)
    cases = [
        (TypeError, "tensor must be a torch.Tensor", ringzero.all_reduce, [1.0, 2.0]),
        (TypeError, "dtype torch.bool", ringzero.all_reduce, torch.ones(4, dtype=torch.bool)),
        (TypeError, "dtype torch.complex64", ringzero.all_reduce, torch.ones(4, dtype=torch.complex64)),
        (ValueError, "contiguous", ringzero.all_reduce, torch.ones(4, 4).t()),
        (ValueError, "is on meta", ringzero.all_reduce, torch.ones(4, device="meta")),
        (ValueError, "op=.*not supported", ringzero.all_reduce, t, dist.ReduceOp.BAND),
        (ValueError, "op='median'", ringzero.all_reduce, t, "median"),
        (TypeError, "group must be a ProcessGroup", ringzero.all_reduce, t, ringzero.ReduceOp.SUM, "world"),
        (ValueError, "input has 8 elements but must have world_size", ringzero.reduce_scatter_single, torch.empty(8), t),
        (TypeError, "output dtype torch.float64 differs", ringzero.reduce_scatter_single,
         torch.empty(8, dtype=torch.float64), torch.empty(8 * world)),
        (ValueError, "output_tensor has 9 elements", ringzero.all_gather_single, torch.empty(9), t),
        (ValueError, "input_tensor must be contiguous", ringzero.all_gather_single, out, torch.ones(8, 2)[:, 0]),
        (ValueError, "counts must hold", ringzero.all_gather_v, out, t, [8]),
        (ValueError, r"input has 8 elements but counts\[", ringzero.all_gather_v, torch.empty(9 * world), t,
         [9] * world),
        (ValueError, "output has 5 elements but sum", ringzero.all_gather_v, torch.empty(5), t, [8] * world),
        (TypeError, "counts must be a sequence of ints", ringzero.all_gather_v, out, t, ["x"] * world),
        (ValueError, "src=7 is not a rank of the group", ringzero.broadcast, t, 7),
        (ValueError, "exactly one of src", ringzero.broadcast, t),
        (ValueError, r"group_dst=-1 must be in \[0,", lambda: ringzero.reduce(t, group_dst=-1)),
    ]
    for exc, pattern, fn, *args in cases:
        expect(exc, pattern, fn, *args)
    # The communicator is still healthy after all of that (no collective ran): compare with gloo.
    x = torch.arange(10, dtype=torch.int64) * (rank + 1)
    want = x.clone()
    dist.all_reduce(want)
    ringzero.all_reduce(x)
    assert torch.equal(x, want)
    return len(cases)


def test_bad_inputs_raise_clear_errors():
    assert run_ranks(2, bad_inputs_body)[0] >= 19


def test_environment_variables_are_validated():
    def body(rank, world):
        os.environ["RINGZERO_ALLREDUCE_ALGO"] = "fastest"
        with pytest.raises(ValueError, match="RINGZERO_ALLREDUCE_ALGO='fastest'"):
            ringzero.all_reduce(torch.ones(2))
        os.environ["RINGZERO_ALLREDUCE_ALGO"] = "auto"
        os.environ["RINGZERO_TIMEOUT_S"] = "soon"
        with pytest.raises(ValueError, match="RINGZERO_TIMEOUT_S='soon' is not a number"):
            ringzero.all_reduce(torch.ones(2))
        return True
    assert all(run_ranks(1, body))


def absent_rank_body(rank, world, during_setup):
    if not during_setup:
        ringzero.barrier()  # the communicator exists; the absent rank then misses collective #2
    if rank == world - 1:
        time.sleep(4)  # never calls the collective; outlives the others' timeout
        return None
    start = time.monotonic()
    with pytest.raises(ringzero.CommTimeout) as info:
        ringzero.all_reduce(torch.ones(100))
    elapsed = time.monotonic() - start
    msg = str(info.value)
    assert "all_reduce" in msg and f"[{world - 1}]" in msg, msg
    assert during_setup or "sequence number 2" in msg, msg
    if not during_setup:
        # What each rank last completed (from shared memory) and this rank's flight recorder file.
        assert f"{world - 1}: barrier #1" in msg, msg
        path = msg.split("flight recorder of this rank: ")[1].strip()
        with open(path) as f:
            log = f.read()
        os.remove(path)
        assert "barrier" in log and "all_reduce" in log and "CommTimeout" in log, log
    return elapsed


@pytest.mark.parametrize("during_setup", [True, False])
def test_absent_rank_times_out_naming_it(during_setup):
    results = run_ranks(3, absent_rank_body, during_setup, env={"RINGZERO_TIMEOUT_S": "1.5"})
    assert all(1.4 < r < 4 for r in results[:2]), results


def killed_rank_body(rank, world, victim):
    x = torch.ones(1 << 20)
    if rank == victim:
        # Die in the middle of the stream of collectives (SIGKILL: no cleanup of any kind runs).
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    start = time.monotonic()
    with pytest.raises(ringzero.CommTimeout) as info:
        for _ in range(100000):
            ringzero.all_reduce(x)
    assert str(victim) in str(info.value), str(info.value)
    return time.monotonic() - start


@pytest.mark.parametrize("hosts", [None, "a,b,a"])
def test_killed_rank_raises_on_the_others(hosts):
    env = {"RINGZERO_TIMEOUT_S": "60"}
    if hosts:
        env["RINGZERO_HOST_IDS"] = hosts
    results = run_ranks(3, killed_rank_body, 1, env=env, expect_exit={1: True}, timeout_s=120)
    # Within the timeout; in practice the dead peer is noticed at once (pid check / closed socket).
    assert all(r is not None and r < 60 for i, r in enumerate(results) if i != 1), results


CROSS_STALL_TIMEOUTS = {
    # rank -> its timeout (s). Rank 1 (host a) stalls in its cross-host step, the ring with rank 3 (host
    # b), for 8 s, then raises. Ranks 0 and 2 then wait for their local peer (1, 3) in the all-gather.
    "local clock first": [2, 60, 2, 6],  # 0 and 2 time out first, while their peer still waits
    "cross step fails first": [60, 60, 60, 2],  # rank 3's ring times out, rank 1's stall ends in an error
}


def cross_host_stall_body(rank, world, case):
    x = torch.ones(1000)
    ringzero.all_reduce(x)  # the communicator, with the default timeout; then each rank's own below
    assert torch.equal(x, torch.full_like(x, world))
    comm = ringzero.get_communicator(dist.group.WORLD)
    assert comm.hierarchical and comm.local_world == 2
    timeout = CROSS_STALL_TIMEOUTS[case][rank]
    comm.shm.set_timeout(timeout)
    comm.cross_ring.timeout_s = timeout
    if rank == 1:
        def stall(*args):
            time.sleep(8)
            raise RuntimeError("rank 1 stalled in its cross-host step (the test's doing)")
        comm.cross_ring.all_reduce = stall
    start = time.monotonic()
    with pytest.raises((ringzero.CommTimeout, RuntimeError)) as info:
        ringzero.all_reduce(x)
    return type(info.value).__name__, str(info.value), time.monotonic() - start


@pytest.mark.parametrize("case", list(CROSS_STALL_TIMEOUTS))
def test_cross_host_stall_is_named_by_the_local_peers(case):
    """Hierarchical all-reduce, 2 hosts x 2 ranks: a local rank that waits for a peer stuck in its
    cross-host step must name the far side (the peer's network neighbour), whichever clock runs out
    first: its own (the segment says where the peer is) or the peer's (whose failure aborts its wait)."""
    res = run_ranks(4, cross_host_stall_body, case, env={"RINGZERO_HOST_IDS": "a,a,b,b"}, timeout_s=120)
    for rank, (kind, msg, took) in enumerate(res):
        print(f"{case}: rank {rank}: {kind} after {took:.1f} s: {msg[:300]}")
    (k0, m0, t0), (k1, m1, t1), (k2, m2, t2), (k3, m3, t3) = res
    assert k1 == "RuntimeError" and "stalled" in m1, m1
    assert k3 == "CommTimeout" and "transfer with rank 1" in m3, m3
    assert k0 == "CommTimeout" and k2 == "CommTimeout", (m0, m2)
    if case == "local clock first":
        assert "group rank 1 is alive and in its cross-host step, waiting on the network with group rank 3" in m0, m0
        assert "group rank 3 is alive and in its cross-host step, waiting on the network with group rank 1" in m2, m2
        assert t0 < 6 and t2 < 6, (t0, t2)
    else:
        # Each at its peer's failure, long before its own 60 s: rank 3's ring at 2 s, rank 1's stall at 8 s.
        assert "aborted by group rank 3" in m2 and "transfer with rank 1" in m2, m2
        assert "aborted by group rank 1" in m0 and "stalled in its cross-host step" in m0, m0
        assert t2 < 6 and t0 < 20, (t0, t2)


def mismatch_body(rank, world):
    t = torch.ones(16)
    with pytest.raises(ringzero.CollectiveMismatch) as info:
        if rank == 1:
            ringzero.broadcast(t, src=0)
        else:
            ringzero.all_reduce(t)
    msg = str(info.value)
    assert "broadcast" in msg and "all_reduce" in msg, msg
    # Every rank raised at the same point, so the communicator stays usable.
    x = torch.full((5,), float(rank))
    ringzero.all_reduce(x)
    assert torch.equal(x, torch.full((5,), float(sum(range(world)))))
    return True


def test_mismatched_collectives_raise_on_every_rank():
    assert all(run_ranks(3, mismatch_body))


def network_mismatch_body(rank, world):
    t = torch.ones(16)
    with pytest.raises(ringzero.CollectiveMismatch) as info:
        if rank == 1:
            ringzero.all_reduce(t, op=ringzero.ReduceOp.MAX)
        else:
            ringzero.all_reduce(t)
    msg = str(info.value)
    assert "RINGZERO_DEBUG=1" in msg and msg.count("all_reduce") >= world, msg
    x = torch.full((5,), float(rank))
    ringzero.all_reduce(x)  # still usable: every rank raised at the same point
    assert torch.equal(x, torch.full((5,), float(sum(range(world)))))
    return True


def test_network_mismatch_detected_with_debug():
    """Between hosts the fingerprint check is opt-in (it costs one small all-gather per call)."""
    env = {"RINGZERO_DEBUG": "1", "RINGZERO_HOST_IDS": "a,b,a", "RINGZERO_TIMEOUT_S": "30"}
    assert all(run_ranks(3, network_mismatch_body, env=env))
