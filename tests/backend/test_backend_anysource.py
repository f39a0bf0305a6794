"""Receive from any source and timeout errors of the "ringzero" backend, against gloo.

Each exchange runs twice, on a dist.new_group(backend="ringzero") group and on a gloo group, and must
give the same answer: recv/irecv with src=None get every message, each from the rank they report
(several senders that start in a random order, seed printed), a recv from a named rank posted earlier
takes that rank's first message, and a timed-out barrier or receive raises with the "Timed out"
wording that torch's own test suite matches for gloo (distributed_test.py, _test_barrier_timeout),
while ringzero's message also names the rank, the op and its sequence number.
"""
import datetime
import random
import re
import time

import pytest
import torch
import torch.distributed as dist

from harness import run_ranks
from reference import check_equal

TORCH_TIMEOUT_WORDING = r" (Timed out|closed|timeout) "  # the regex of torch's barrier-timeout test


def groups():
    """A ringzero group and a gloo group over all ranks (every rank calls this, in the same order)."""
    return {"ringzero": dist.new_group(backend="ringzero"), "gloo": dist.new_group(backend="gloo")}


def any_source_senders(rank, world, seed):
    """Every rank but 0 sends two messages (its rank, then its rank + 100) after a random delay; rank 0
    takes all of them with recv(src=None) and irecv(src=None) on each backend. Returns the senders seen."""
    seen = {}
    for name, g in groups().items():
        if rank == 0:
            got = []
            for i in range(world - 1):
                t = torch.empty(4, dtype=torch.int64)
                src = dist.recv(t, group=g)  # src=None: any source
                got.append((src, int(t[0])))
            works = []
            for i in range(world - 1):
                t = torch.empty(4, dtype=torch.int64)
                works.append((dist.irecv(t, group=g), t))
            for w, t in works:
                w.wait()
                got.append((w._source_rank(), int(t[0])))
            for src, value in got:
                assert value in (src, src + 100), f"{name}: a message of rank {value % 100} reported as from {src}"
            assert sorted(got) == sorted([(r, r) for r in range(1, world)] + [(r, r + 100) for r in range(1, world)]), \
                f"{name}: got {got}"
            for r in range(1, world):  # one sender's messages arrive in the order it sent them
                mine = [v for src, v in got if src == r]
                assert mine == [r, r + 100], f"{name}: rank {r}'s messages arrived as {mine}"
            seen[name] = sorted(src for src, _ in got)
        else:
            time.sleep(random.Random(seed * 100 + rank).uniform(0, 0.3))
            dist.send(torch.full((4,), rank, dtype=torch.int64), 0, group=g)
            dist.send(torch.full((4,), rank + 100, dtype=torch.int64), 0, group=g)
        dist.barrier()
    return seen


def named_before_any(rank, world):
    """Rank 0 posts irecv(src=1) and then recv(src=None); rank 1 sends 10 then 11, rank 2 sends 20: the
    named receive must get 10 (rank 1's first message), the any-source one 11 or 20, the last 20 or 11."""
    seen = {}
    for name, g in groups().items():
        if rank == 0:
            named = torch.empty(3, dtype=torch.int64)
            work = dist.irecv(named, 1, group=g)
            first, second = torch.empty(3, dtype=torch.int64), torch.empty(3, dtype=torch.int64)
            src_a = dist.recv(first, group=g)
            src_b = dist.recv(second, group=g)
            work.wait()
            check_equal(named, torch.full((3,), 10), f"{name}: named recv from rank 1")
            pairs = sorted([(src_a, int(first[0])), (src_b, int(second[0]))])
            assert pairs == [(1, 11), (2, 20)], f"{name}: any-source receives got {pairs}"
            seen[name] = pairs
        elif rank == 1:
            dist.send(torch.full((3,), 10), 0, group=g)
            dist.send(torch.full((3,), 11), 0, group=g)
        else:
            dist.send(torch.full((3,), 20), 0, group=g)
        dist.barrier()
    return seen


@pytest.mark.parametrize("world", [2, 3])
def test_recv_any_source_matches_gloo(world):
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    results = run_ranks(world, any_source_senders, seed, timeout_s=300)
    assert results[0]["ringzero"] == results[0]["gloo"] == sorted(list(range(1, world)) * 2), results[0]


def test_named_recv_keeps_its_message():
    results = run_ranks(3, named_before_any, timeout_s=300)
    assert results[0]["ringzero"] == results[0]["gloo"], results[0]


def timeouts(rank, world):
    """Only rank 0 calls barrier (then recv from any source) on 1 s groups; the others never do."""
    one_s = datetime.timedelta(seconds=1)
    messages = {}
    gs = {"ringzero": dist.new_group(backend="ringzero", timeout=one_s),
          "gloo": dist.new_group(backend="gloo", timeout=one_s)}
    quiet = dist.new_group(backend="ringzero", timeout=one_s)  # nobody sends on it
    if rank == 0:
        for name, g in gs.items():
            start = time.monotonic()
            with pytest.raises(Exception, match=TORCH_TIMEOUT_WORDING) as barrier_error:
                dist.barrier(group=g)
            waited_s = time.monotonic() - start
            assert 0.9 <= waited_s < 30, f"{name} barrier raised after {waited_s:.2f} s, not the 1 s timeout"
            messages[name] = str(barrier_error.value)
        with pytest.raises(Exception, match="Timed out waiting 1000ms") as recv_error:
            dist.recv(torch.empty(2), group=quiet)
        messages["ringzero recv any"] = str(recv_error.value)
    dist.barrier()  # the default gloo group, with its long timeout
    return messages


def test_timeout_wording_matches_gloo():
    messages = run_ranks(2, timeouts, timeout_s=300)[0]
    print(messages)
    # ringzero keeps its own details: the rank, the op and its sequence number.
    assert re.search(r"barrier \(sequence number \d+\) on group rank 0", messages["ringzero"]), messages
    assert "Timed out waiting 1000ms" in messages["ringzero"], messages
    assert "on rank 0" in messages["ringzero recv any"], messages
