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
from ringzero import _C
from harness import run_ranks
from collective_cases import check_all, random_floats_and_async
from reference import SMALL_BUFFERS, check_equal, gloo_reference, make

def single_host_body(rank, world):
    cases = 0
    for algo in _C.cpu_all_reduce_algorithms():  # every CPU algorithm the extension runs
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


@pytest.mark.parametrize("hosts", ["a,a,b,b", "a,b,a,b,a,b"])
def test_pipelined_hierarchical_matches_gloo(hosts):
    """The hierarchical all-reduce cut in segments (comm/transports.py [Note: the pipelined hierarchical
    all-reduce]) with 1 KiB segments, so that the sizes from 1031 elements up take it."""
    def body(rank, world):
        from ringzero.comm import transports
        transports.PIPELINE_SEGMENT_BYTES = 1024
        return multi_host_body(rank, world)
    world = len(hosts.split(","))
    results = run_ranks(world, body, env={**SMALL_BUFFERS, "RINGZERO_HOST_IDS": hosts})
    assert all(m == "hierarchical" for m, _ in results), results


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
