"""The "ringzero" torch.distributed backend, op by op, through the torch.distributed API (the suite is
tests/helpers/backend_cases.py).

Each rank runs every op twice on the same inputs: on a group made with
dist.new_group(backend="ringzero") and on the harness's gloo group, and the results must be equal
(integer-valued inputs make float comparisons exact; AVG, which gloo lacks, is gloo SUM divided by
the world size; PREMUL_SUM is gloo SUM of the premultiplied inputs; uneven all_gather is checked
against each rank's known input). backend_stats() must show that the implemented ops ran on
ringzero's kernels (send/recv with tag 0 on its shared-memory channels) and the handed-on ones
(all-to-all, gather, scatter, tagged send/recv, bitwise ops) on the inner gloo backend, which must give gloo's answer. Bad arguments must raise ValueError/TypeError.
World sizes 1-5, sizes 0, 1, 13 and 1031 (larger than the 4 KiB staging buffer used here).
"""
import pytest
import torch
import torch.distributed as dist

import ringzero
from backend_cases import body
from harness import run_ranks
from reference import SMALL_BUFFERS


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_backend_ops_match_gloo(world):
    out = run_ranks(world, body, env=SMALL_BUFFERS)
    assert all(calls > 0 and kind is None for calls, kind in out)


def test_collective_mismatch_is_reported():
    """Ranks calling different sizes get ringzero.CollectiveMismatch from the shared-memory check,
    not a hang or garbage; the timeout bounds every wait."""
    def mismatch(rank, world):
        g = dist.new_group(backend="ringzero")
        with pytest.raises(ringzero.CollectiveMismatch, match="mismatch"):
            dist.all_reduce(torch.ones(5 + rank), group=g)
        return True

    assert all(run_ranks(3, mismatch, env=SMALL_BUFFERS))


@pytest.mark.parametrize("hosts,names", [(None, r"waiting for group ranks \[1\]"),
                                         ("a,b", r"point-to-point transfer with rank 1 failed or timed out")])
def test_timeout_names_the_missing_rank(hosts, names):
    """A rank that never joins: the others get ringzero.CommTimeout after RINGZERO_TIMEOUT_S (the
    group's timeout otherwise), naming the rank they waited for, instead of hanging; on one host and
    across (forced) hosts, where the engine's ring waits for it."""
    def body_(rank, world):
        g = dist.new_group(backend="ringzero")
        if rank == 0:
            with pytest.raises(ringzero.CommTimeout, match=names):
                dist.all_reduce(torch.ones(4), group=g)
        dist.barrier()  # gloo: rank 1 leaves only after rank 0 has seen its error
        return True

    env = {"RINGZERO_TIMEOUT_S": "2", **({"RINGZERO_HOST_IDS": hosts} if hosts else {})}
    assert all(run_ranks(2, body_, env=env))


@pytest.mark.parametrize("hosts,kind", [("a,b", "NetworkRing"), ("a,a,b,b", "Hierarchical"), ("a,b,a", "NetworkRing"),
                                        ("a,b,c", "NetworkRing"), ("a,b,a,b,a,b", "Hierarchical")])
def test_group_across_hosts_runs_ringzero_collectives(hosts, kind):
    """A group whose ranks are on different hosts (forced with RINGZERO_HOST_ID): every collective runs on
    ringzero's engine across hosts (backend_stats: native), the one ringzero.* runs for that layout: the
    hierarchical form for equal hosts of several ranks (a,a,b,b), else the flat ring; and gives gloo's
    answer, op by op as on one host. Point-to-point and the ops ringzero lacks go to gloo."""
    world = len(hosts.split(","))
    out = run_ranks(world, body, True, [0, 1, 13, 1031], env={**SMALL_BUFFERS, "RINGZERO_HOST_IDS": hosts})
    assert all(calls > 0 and got == kind for calls, got in out), out


def strided_calls(rank, world):
    """Non-contiguous tensors: ringzero's own ops give the right elements and leave the others alone; the ops it
    hands to the inner gloo, which writes such a tensor as if it were contiguous (a plain gloo group gave wrong
    elements for the reductions, checked below), raise ValueError naming the op instead."""
    g = dist.new_group(backend="ringzero")

    def ints(r):
        return (torch.arange(7) * (r + 1) + 3).to(torch.int32)

    x = ints(rank)
    dist.all_reduce(x[::2], group=g)  # SUM: ringzero's own
    want = ints(rank)
    want[::2] = sum(ints(r)[::2] for r in range(world))
    assert torch.equal(x, want)
    x = ints(rank)
    dist.broadcast(x[1::3], src=world - 1, group=g)
    want = ints(rank)
    want[1::3] = ints(world - 1)[1::3]
    assert torch.equal(x, want)

    for call, op in [(lambda t: dist.all_reduce(t, op=dist.ReduceOp.BXOR, group=g), "allreduce"),
                     (lambda t: dist.reduce(t, dst=0, op=dist.ReduceOp.BOR, group=g), "reduce"),
                     (lambda t: dist.all_reduce_coalesced([ints(rank), t], op=dist.ReduceOp.BAND, group=g),
                      "allreduce_coalesced")]:
        x = ints(rank)
        with pytest.raises(ValueError, match=f"ringzero {op}: a non-contiguous tensor"):
            call(x[::2])
        assert torch.equal(x, ints(rank)), op  # nothing written
        y = x[::2].contiguous()
        call(y)  # the fix the message names: a contiguous tensor
        if op != "reduce" or rank == 0:
            parts = [ints(r)[::2] for r in range(world)]
            fold = {"allreduce": lambda a, b: a ^ b, "reduce": lambda a, b: a | b,
                    "allreduce_coalesced": lambda a, b: a & b}[op]
            want = parts[0]
            for p in parts[1:]:
                want = fold(want, p)
            assert torch.equal(y, want), op

    # scatter, gather and all_to_all_single are ringzero's own (a plain gloo group writes scatter's strided
    # output as if contiguous and refuses all_to_all_single's): the right elements, the others untouched.
    out = torch.zeros(8, dtype=torch.int32)
    inputs = [torch.full((4,), q + 1, dtype=torch.int32) for q in range(world)] if rank == 0 else None
    dist.scatter(out[::2], inputs, src=0, group=g)
    assert torch.equal(out, torch.tensor([rank + 1, 0] * 4, dtype=torch.int32))

    outs = [torch.zeros(8, dtype=torch.int32)[::2] for _ in range(world)] if rank == 0 else None
    dist.gather(ints(rank)[::2][:4], outs, dst=0, group=g)
    assert rank != 0 or all(torch.equal(outs[q], ints(q)[::2][:4]) for q in range(world))

    base = torch.zeros(4 * world, dtype=torch.int32)
    strided_in = lambda q: (torch.arange(4 * world, dtype=torch.int32) + 100 * q)[::2]  # noqa: E731
    dist.all_to_all_single(base[::2], strided_in(rank), group=g)
    want = torch.cat([strided_in(q)[2 * rank:2 * rank + 2] for q in range(world)])
    assert torch.equal(base[::2], want) and not base[1::2].any()
    dist.destroy_process_group(g)
    return True


@pytest.mark.parametrize("hosts", [None, "a,a,b"])
def test_non_contiguous_tensors_right_or_refused(hosts):
    assert all(run_ranks(3, strided_calls, env={"RINGZERO_HOST_IDS": hosts} if hosts else None))
