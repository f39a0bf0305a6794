"""The wait policy of the shared-memory collectives ([Note: waiting in the shared-memory collectives],
csrc/core/shm_wait.h), which removed the slow regime of issue 24: a blocking call's waiter spins and
never sleeps or yields while its peer arrives soon; it sleeps once the peer is late past the spin
budget, so a late peer costs it no more than that budget of CPU; an async call's worker never spins
(it shares the core with the caller's compute); with more ranks than usable cores nothing spins.

What is compared: the kernel's own accounting of the waiting thread (voluntary context switches are
sleeps; CPU time from getrusage(RUSAGE_THREAD)) against what the policy allows, and the results of
the collectives against the known sum. Margins are wide (the spin budget is 50 ms; the late peer
arrives after 20 ms or after 400 ms), so load on the machine cannot flip the verdict.
"""
import os
import resource
import time

import pytest
import torch
import torch.distributed as dist

import ringzero
from harness import run_ranks
from ringzero.comm.communicator import get_communicator

LATE_SOON_S = 0.02   # well inside the 50 ms spin budget
LATE_LONG_S = 0.4    # far past it


def _late_peer_wait(rank, world, late_s):
    """Rank 1 enters the all-reduce late_s after rank 0; returns rank 0's (voluntary switches, CPU
    seconds, wall seconds) of its waiting thread during the call, after checking the sum."""
    x = torch.full((1024,), float(rank + 1))
    ringzero.all_reduce(x)  # set up the communicator outside the measurement
    ringzero.barrier()
    if rank == 1:
        time.sleep(late_s)
    before = resource.getrusage(resource.RUSAGE_THREAD)
    t0 = time.perf_counter()
    ringzero.all_reduce(x)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_THREAD)
    assert torch.equal(x, torch.full((1024,), 2.0 * sum(range(1, world + 1)))), x[:4]
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return after.ru_nvcsw - before.ru_nvcsw, cpu, wall


def test_a_waiter_spins_for_a_peer_that_comes_soon():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("this test needs 2 usable cores (the spinning policy applies only when every rank has one)")
    sleeps, cpu, wall = run_ranks(2, _late_peer_wait, LATE_SOON_S, timeout_s=120)[0]
    assert wall >= LATE_SOON_S * 0.9, wall
    assert sleeps == 0, f"rank 0 slept {sleeps} times while its peer was only {LATE_SOON_S} s late"


def test_a_waiter_sleeps_once_its_peer_is_late():
    sleeps, cpu, wall = run_ranks(2, _late_peer_wait, LATE_LONG_S, timeout_s=120)[0]
    assert wall >= LATE_LONG_S * 0.9, wall
    assert sleeps >= 1, "rank 0 never slept while its peer was late by 0.4 s"
    # 50 ms of spinning, then sleeps woken every 20 ms for the liveness checks: far below the wait.
    assert cpu < LATE_LONG_S / 2, f"rank 0 burnt {cpu:.3f} s of CPU waiting {wall:.3f} s for a late peer"


def _spin_modes(rank, world):
    comm = get_communicator(dist.group.WORLD)
    x = torch.ones(16)
    ringzero.all_reduce(x)
    modes = {"blocking": comm.shm.spin}
    seen = []
    comm.run(lambda: seen.append(comm.shm.spin), True, None, "probe").wait()
    modes["async"] = seen[0]
    ringzero.all_reduce(x)
    modes["blocking after async"] = comm.shm.spin
    assert torch.equal(x, torch.full((16,), float(world * world)))
    return modes


def test_blocking_calls_spin_and_async_calls_do_not():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("this test needs 2 usable cores")
    for modes in run_ranks(2, _spin_modes, timeout_s=120):
        assert modes == {"blocking": True, "async": False, "blocking after async": True}, modes


def _pinned_spin_modes(rank, world):
    return _spin_modes(rank, world)


def test_nothing_spins_with_more_ranks_than_usable_cores():
    # Both ranks pinned to one core (set before the communicator exists, inherited by the forked ranks).
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(saved)})
    try:
        results = run_ranks(2, _pinned_spin_modes, timeout_s=120)
    finally:
        os.sched_setaffinity(0, saved)
    for modes in results:
        assert modes == {"blocking": False, "async": False, "blocking after async": False}, modes
