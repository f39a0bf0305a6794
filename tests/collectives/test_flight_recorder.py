"""The flight recorder's clock: a collective reads time.perf_counter once when it begins to run and once
when it ends, inline or queued (async_op) alike, and its entry and the communicator's busy time share those
two reads. Reference: a counter wrapped around time.perf_counter in one process (world 1, gloo)."""
from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import ringzero
from ringzero.comm import flight


@pytest.fixture
def world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        ringzero.all_reduce(torch.ones(4), async_op=True).wait()  # makes the communicator
        yield
    finally:
        ringzero.destroy_communicators()
        dist.destroy_process_group()


@pytest.mark.parametrize("async_op", [False, True])
def test_a_call_reads_the_clock_once_at_each_end(world_of_one, monkeypatch, async_op):
    reads = []
    real = time.perf_counter
    monkeypatch.setattr(flight.time, "perf_counter", lambda: reads.append(1) or real())
    work = ringzero.all_reduce(torch.ones(4), async_op=async_op)
    if work is not None:
        work.wait()
    monkeypatch.undo()
    comm = ringzero.get_communicator(dist.group.WORLD)
    entry = comm.flight.entries[-1]
    assert len(reads) == 2, reads
    assert entry[1] == "all_reduce" and entry[4] is not None and entry[5] is not None and entry[6] == "ok"
