"""Who runs an op of the "ringzero" backend ([Note: the caller runs its own collective], csrc/torch/backend_work.h):
a blocking call (async_op=False) runs on its caller's thread when nothing is queued before it, an async one is
queued for the worker thread, and a Work.wait() runs what is queued up to its op. Whichever thread runs them, each
rank's ops must run in call order, one at a time, or the ranks' shared-memory sequences part.

The test mixes blocking and async all_reduce, all_gather_into_tensor, reduce_scatter_tensor and broadcast of
random sizes (0, 1, primes, many times the 4 KiB slot used here) in one order on every rank; each rank waits for
its async ops in an order of its own (random per rank), some with a timeout given to wait(), some never waited
for but polled with is_completed(). Every result is an exact integer checked against what the ranks' known
inputs give. One host (shared memory) at world sizes 2-4, and two forced hosts (the engine across hosts).
"""
import os
import random
import time

import pytest
import torch
import torch.distributed as dist

import ringzero
from harness import run_ranks
from reference import SMALL_BUFFERS

SIZES = [0, 1, 2, 13, 1031, 4099, 40_009]


def mixed_calls(rank, world, seed, calls):
    g = dist.new_group(backend="ringzero")
    plan = random.Random(seed)              # the same ops on every rank
    mine = random.Random(seed * 1000 + rank)  # this rank's own order of waits
    pending, checked = [], 0

    def check(item):
        nonlocal checked
        got, want, what = item[1], item[2], item[3]
        assert torch.equal(got, want), f"seed {seed}, rank {rank}: {what} differs from the expected result"
        checked += 1

    for i in range(calls):
        op = plan.choice(["all_reduce", "all_gather", "reduce_scatter", "broadcast"])
        n = plan.choice(SIZES)
        blocking = plan.random() < 0.5
        # Integer values: sums are exact in float32 at these sizes.
        base = torch.arange(n, dtype=torch.float32) % 97
        if op == "all_reduce":
            x = base + rank + i
            want = base * world + sum(range(world)) + i * world
            work = dist.all_reduce(x, group=g, async_op=not blocking)
            item = (work, x, want, f"call {i}: all_reduce n={n}")
        elif op == "all_gather":
            x = base + 100 * rank + i
            out = torch.empty(n * world)
            want = torch.cat([base + 100 * r + i for r in range(world)])
            work = dist.all_gather_into_tensor(out, x, group=g, async_op=not blocking)
            item = (work, out, want, f"call {i}: all_gather_into_tensor n={n}")
        elif op == "reduce_scatter":
            full = torch.arange(n * world, dtype=torch.float32) % 89
            x = full + rank + i
            out = torch.empty(n)
            want = (full * world + sum(range(world)) + i * world)[rank * n:(rank + 1) * n]
            work = dist.reduce_scatter_tensor(out, x, group=g, async_op=not blocking)
            item = (work, out, want, f"call {i}: reduce_scatter_tensor n={n}")
        else:
            root = plan.randrange(world)
            x = base + 1000 * rank + i
            want = base + 1000 * root + i
            work = dist.broadcast(x, src=root, group=g, async_op=not blocking)
            item = (work, x, want, f"call {i}: broadcast from {root} n={n}")
        if blocking:
            check(item)
        else:
            pending.append(item)
        while pending and mine.random() < 0.3:  # wait for one of the pending ops, any of them
            item = pending.pop(mine.randrange(len(pending)))
            how = mine.choice(["wait", "wait with a timeout", "poll"])
            if how == "wait":
                item[0].wait()
            elif how == "wait with a timeout":
                item[0].wait(timeout=__import__("datetime").timedelta(seconds=60))
            else:  # never waited for: the worker must run it on its own
                deadline = time.monotonic() + 60
                while not item[0].is_completed():
                    assert time.monotonic() < deadline, f"seed {seed}, rank {rank}: {item[3]} never completed"
                    time.sleep(0.0005)
            check(item)
    for item in pending:
        item[0].wait()
        check(item)
    native = ringzero.backend_stats(g)["native"]
    dist.destroy_process_group(g)
    return checked, sum(native.values())


@pytest.mark.parametrize("world,hosts", [(2, None), (3, None), (4, None), (2, "a,b")])
def test_blocking_and_async_calls_keep_their_order(world, hosts):
    seed = int(os.environ.get("RINGZERO_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (rerun with RINGZERO_TEST_SEED={seed})")
    calls = 60
    env = {**SMALL_BUFFERS, **({"RINGZERO_HOST_IDS": hosts} if hosts else {})}
    out = run_ranks(world, mixed_calls, seed, calls, env=env, timeout_s=300)
    assert all(checked == calls for checked, _ in out), out
    assert all(native >= calls for _, native in out), f"not every op ran on ringzero's own collectives: {out}"


def test_async_ops_left_queued_at_destroy_still_run():
    """Async ops that nobody waits for when the group is destroyed: the worker runs them before it stops, on
    every rank alike (the queue is drained, not dropped)."""
    def body(rank, world):
        g = dist.new_group(backend="ringzero")
        xs = [torch.full((5003,), float(rank + i)) for i in range(8)]
        works = [dist.all_reduce(x, group=g, async_op=True) for x in xs]
        dist.destroy_process_group(g)
        want = [float(sum(r + i for r in range(world))) for i in range(8)]
        assert all(w.is_completed() for w in works)
        return [x[0].item() for x in xs] == want and all(bool((x == x[0]).all()) for x in xs)

    assert all(run_ranks(3, body, env=SMALL_BUFFERS))
