"""The op-by-op suite of the "ringzero" torch.distributed backend, shared by tests/backend/test_backend_ops.py (ranks
forked on this machine, hosts forced with RINGZERO_HOST_ID) and tests/helpers/run_hostlab_rank.py (the host lab's
separate hosts). Each rank runs every op twice on the same inputs: on the group `g` made with
dist.new_group(backend="ringzero") and on the default gloo group, and the results must be equal
(integer-valued inputs make float comparisons exact; AVG, which gloo lacks, is gloo SUM divided by the
world size; PREMUL_SUM is gloo SUM of the premultiplied inputs; uneven all_gather is checked against each
rank's known input). backend_stats() must show which ops ran on ringzero's collectives and which on the
inner gloo backend, which must give gloo's answer. Bad arguments must raise ValueError/TypeError.
"""
import pytest
import torch
import torch.distributed as dist

import ringzero
from ringzero.comm import torch_compat
from ringzero.comm.backend import hosts_engines
from reference import DTYPES, OPS, check_equal, gloo_reference, make

TORCH_OP = {ringzero.ReduceOp.SUM: dist.ReduceOp.SUM, ringzero.ReduceOp.AVG: dist.ReduceOp.AVG,
            ringzero.ReduceOp.MIN: dist.ReduceOp.MIN, ringzero.ReduceOp.MAX: dist.ReduceOp.MAX,
            ringzero.ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT}
SIZES = [0, 1, 13, 1031]
IMPLEMENTED = {"allreduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "allreduce_coalesced", "allgather_into_tensor_coalesced",
               "reduce_scatter_tensor_coalesced", "barrier", "alltoall_base", "gather", "scatter"}


def reductions(rank, world, g, dtype, n):
    x = make(rank, n, dtype)
    big = make(rank, n * world, dtype, salt=1)
    for op in OPS:
        tag = f"{dtype} n={n} {op.name}"
        want = gloo_reference(x, op, world)
        got = x.clone()
        dist.all_reduce(got, op=TORCH_OP[op], group=g)
        check_equal(got, want, f"all_reduce {tag}")

        dst = n % world
        got = x.clone()
        dist.reduce(got, dst=dst, op=TORCH_OP[op], group=g)
        if rank == dst:
            check_equal(got, want, f"reduce {tag}")

        block = gloo_reference(big, op, world)[rank * n:(rank + 1) * n]
        out = torch.full((n,), 7, dtype=dtype)
        torch_compat.reduce_scatter_single(out, big, op=TORCH_OP[op], group=g)
        check_equal(out, block, f"reduce_scatter_tensor {tag}")
        out = torch.full((n,), 7, dtype=dtype)
        dist.reduce_scatter(out, [big[q * n:(q + 1) * n] for q in range(world)], op=TORCH_OP[op], group=g)
        check_equal(out, block, f"reduce_scatter (list) {tag}")


def data_movement(rank, world, g, dtype, n):
    x = make(rank, n, dtype)
    want = torch.empty(n * world, dtype=dtype)
    torch_compat.all_gather_single(want, x)  # gloo
    got = torch.empty(n * world, dtype=dtype)
    torch_compat.all_gather_single(got, x, group=g)
    check_equal(got, want, f"all_gather_into_tensor {dtype} n={n}")
    outs = [torch.empty(n, dtype=dtype) for _ in range(world)]
    dist.all_gather(outs, x, group=g)
    check_equal(torch.cat(outs), want, f"all_gather (list) {dtype} n={n}")

    counts = [(n * (q + 1)) // world + q for q in range(world)]  # uneven sizes
    outs = [torch.empty(c, dtype=dtype) for c in counts]
    dist.all_gather(outs, make(rank, counts[rank], dtype, salt=2), group=g)
    check_equal(torch.cat(outs), torch.cat([make(q, counts[q], dtype, salt=2) for q in range(world)]),
                f"all_gather uneven {dtype} n={n}")

    src = (n + 1) % world
    buf = make(rank, n, dtype, salt=3) if rank == src else torch.zeros(n, dtype=dtype)
    ref = buf.clone()
    dist.broadcast(ref, src=src)  # gloo
    dist.broadcast(buf, src=src, group=g)
    check_equal(buf, ref, f"broadcast {dtype} n={n}")

    splits = [(n * (q + rank + 1)) % 7 for q in range(world)]  # uneven, zero blocks too
    x = make(rank, sum(splits), dtype, salt=4)
    recv = [(n * (rank + q + 1)) % 7 for q in range(world)]
    want, got = torch.empty(sum(recv), dtype=dtype), torch.empty(sum(recv), dtype=dtype)
    dist.all_to_all_single(want, x, recv, splits)  # gloo
    dist.all_to_all_single(got, x, recv, splits, group=g)
    check_equal(got, want, f"all_to_all_single {dtype} n={n}")
    dst = n % world
    x = make(rank, n, dtype, salt=5)
    got = [torch.empty(n, dtype=dtype) for _ in range(world)] if rank == dst else None
    dist.gather(x, got, dst=dst, group=g)
    if rank == dst:
        check_equal(torch.cat(got), torch.cat([make(q, n, dtype, salt=5) for q in range(world)]), f"gather {dtype} n={n}")
    chunks = [make(q, n, dtype, salt=6) for q in range(world)] if rank == dst else None
    got = torch.empty(n, dtype=dtype)
    dist.scatter(got, chunks, src=dst, group=g)
    check_equal(got, make(rank, n, dtype, salt=6), f"scatter {dtype} n={n}")


def coalesced_forms(rank, world, g, device=None):
    """The three coalesced forms through _coalescing_manager. Without device= torch hands the captured
    ops to the *_coalesced entry points; with it, torch also brackets them with the backend's
    startCoalescing() and waits on the Work endCoalescing() returns instead of theirs ([Note:
    coalescing], backend.h), so that Work must cover them."""
    where = {} if device is None else {"device": device}
    tag = f", device={device}" if device is not None else ""
    xs = [make(rank, n, torch.float32, salt=n) for n in (5, 300, 1, 1031)]
    wants = [gloo_reference(x, ringzero.ReduceOp.SUM, world) for x in xs]
    with dist._coalescing_manager(group=g, **where):
        for x in xs:
            dist.all_reduce(x, group=g)
    for x, w in zip(xs, wants):
        check_equal(x, w, "coalesced all_reduce" + tag)

    ins = [make(rank, n, torch.int32, salt=n) for n in (3, 700)]
    outs = [torch.empty(i.numel() * world, dtype=torch.int32) for i in ins]
    with dist._coalescing_manager(group=g, async_ops=True, **where) as cm:
        for o, i in zip(outs, ins):
            torch_compat.all_gather_single(o, i, group=g)
    if device is not None:  # the end Work's future: every part's outputs
        assert len(cm.works) == 1 and len(cm.works[0].get_future().wait()) == 2, cm.works
    cm.wait()
    for o, i in zip(outs, ins):
        check_equal(o, torch.cat([make(q, i.numel(), torch.int32, salt=i.numel()) for q in range(world)]),
                    "coalesced all_gather_into_tensor" + tag)

    bigs = [make(rank, n * world, torch.float64, salt=n) for n in (2, 600)]
    outs = [torch.empty(b.numel() // world, dtype=torch.float64) for b in bigs]
    with dist._coalescing_manager(group=g, **where):
        for o, b in zip(outs, bigs):
            torch_compat.reduce_scatter_single(o, b, op=dist.ReduceOp.MAX, group=g)
    for o, b in zip(outs, bigs):
        k = o.numel()
        check_equal(o, gloo_reference(b, ringzero.ReduceOp.MAX, world)[rank * k:(rank + 1) * k],
                    "coalesced reduce_scatter" + tag)
    if device is None:
        return

    # An op torch does not capture runs at once inside the manager; the end Work covers it too (one
    # handed to gloo likewise: fallbacks()).
    buf = make(rank, 1031, torch.int64, salt=9) if rank == 0 else torch.zeros(1031, dtype=torch.int64)
    with dist._coalescing_manager(group=g, async_ops=True, **where) as cm:
        dist.broadcast(buf, src=0, group=g, async_op=True)
    cm.wait()
    check_equal(buf, make(0, 1031, torch.int64, salt=9), "broadcast inside a coalescing manager")

    # An empty bracket gives a completed Work; nesting and an end without a start say what is wrong.
    with dist._coalescing_manager(group=g, async_ops=True, **where) as cm:
        pass
    assert cm.works[0].is_completed() and cm.works[0].get_future().wait() == []
    g._start_coalescing(device)
    with pytest.raises(RuntimeError, match="cannot nest"):
        g._start_coalescing(device)
    g._end_coalescing(device).wait()
    with pytest.raises(RuntimeError, match="without startCoalescing"):
        g._end_coalescing(device)


def coalesced_and_special(rank, world, g):
    coalesced_forms(rank, world, g)
    coalesced_forms(rank, world, g, torch.device("cpu"))

    # PREMUL_SUM (FSDP2 uses it with gradient_divide_factor): gloo SUM of the premultiplied input.
    x = make(rank, 999, torch.float32)
    got = x.clone()
    dist.all_reduce(got, op=dist._make_nccl_premul_sum(0.25), group=g)
    check_equal(got, gloo_reference(x * 0.25, ringzero.ReduceOp.SUM, world), "all_reduce PREMUL_SUM")

    # Non-contiguous tensors are staged through a contiguous copy and written back.
    m = make(rank, 60, torch.float32).view(6, 10).t()
    want = gloo_reference(m.contiguous(), ringzero.ReduceOp.SUM, world)
    dist.all_reduce(m, group=g)
    check_equal(m.contiguous(), want, "all_reduce of a transposed tensor")

    # Dtypes our kernels do not reduce still move, as bytes.
    for t in (torch.tensor([True, False, rank % 2 == 0]), torch.arange(4).to(torch.complex64) * (rank + 1j)):
        ref, got = t.clone(), t.clone()
        dist.broadcast(ref, src=world - 1)
        dist.broadcast(got, src=world - 1, group=g)
        check_equal(got, ref, f"broadcast {t.dtype}")

    # Async handles: futures complete with the written tensors and chain like gloo's (DDP comm hooks).
    x = make(rank, 77, torch.float32)
    want = gloo_reference(x, ringzero.ReduceOp.SUM, world)
    work = dist.all_reduce(x, group=g, async_op=True)
    doubled = work.get_future().then(lambda f: f.value()[0] * 2)
    assert work.wait()
    check_equal(doubled.wait(), want * 2, "future chained on an async all_reduce")
    dist.barrier(group=g)


def fallbacks(rank, world, g):
    """Ops handed to the inner gloo backend (bitwise reductions, tagged point-to-point) give gloo's answer;
    returns their names."""
    bits = torch.tensor([0b1011, 0b0110, 0b1111], dtype=torch.int32) ^ rank
    want, got = bits.clone(), bits.clone()
    dist.all_reduce(want, op=dist.ReduceOp.BAND)
    dist.all_reduce(got, op=dist.ReduceOp.BAND, group=g)
    check_equal(got, want, "all_reduce BAND")
    got = bits.clone()  # inside _coalescing_manager(device=...), the end Work covers gloo's Work too
    with dist._coalescing_manager(group=g, device=torch.device("cpu"), async_ops=True) as cm:
        dist.all_reduce(got, op=dist.ReduceOp.BAND, group=g, async_op=True)
    cm.wait()
    check_equal(got, want, "all_reduce BAND inside a coalescing manager")

    if world > 1:  # a tag other than 0 is the inner backend's
        right, left = (rank + 1) % world, (rank - 1) % world
        recv = torch.empty(5)
        works = [dist.isend(torch.full((5,), float(rank)), right, group=g, tag=7),
                 dist.irecv(recv, left, group=g, tag=7)]
        for w in works:
            w.wait()
        check_equal(recv, torch.full((5,), float(left)), "tagged send/recv ring")
    return {"allreduce", "allreduce_coalesced"} | ({"send", "recv"} if world > 1 else set())


def point_to_point(rank, world, g, gloo_receives=False):
    """send/recv on our channels against the same exchange over gloo. gloo_receives: the group hands
    point-to-point to gloo (it spans hosts), whose receives take contiguous buffers only."""
    right, left = (rank + 1) % world, (rank - 1) % world
    for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.bool):
        for n in (0, 1, 5003):  # 5003 elements stream through many 4 KiB slots
            mine = make(rank, n, torch.int64, salt=5).to(dtype)
            want, got = torch.zeros(n, dtype=dtype), torch.zeros(n, dtype=dtype)
            for group, out in ((None, want), (g, got)):
                works = [dist.isend(mine, right, group=group), dist.irecv(out, left, group=group)]
                for w in works:
                    w.wait()
            check_equal(got, want, f"isend/irecv ring {dtype} n={n}")
    # Everyone sends to everyone at once (a thread per peer and direction: no ordering deadlock),
    # into non-contiguous receive buffers.
    outs = {q: torch.zeros(300, 8) if gloo_receives else torch.zeros(8, 300).t() for q in range(world) if q != rank}
    works = [dist.isend(torch.full((300, 8), float(rank * 10 + q)), q, group=g) for q in outs]
    works += [dist.irecv(outs[q], q, group=g) for q in outs]
    for w in works:
        w.wait()
    for q, out in outs.items():
        check_equal(out, torch.full((300, 8), float(q * 10 + rank)), f"all-pairs message from {q}")
    # Blocking calls, paired in order.
    x = torch.arange(10.0) + rank
    if rank == 0:
        dist.send(x, 1, group=g)
        dist.recv(x, 1, group=g)
        check_equal(x, torch.arange(10.0) + 1, "blocking recv on rank 0")
    elif rank == 1:
        y = torch.empty(10)
        dist.recv(y, 0, group=g)
        dist.send(x, 0, group=g)
        check_equal(y, torch.arange(10.0), "blocking recv on rank 1")


def bad_arguments(rank, world, g):
    with pytest.raises(ValueError, match="world_size"):
        torch_compat.reduce_scatter_single(torch.empty(3), torch.empty(3 * world + 1), group=g)
    with pytest.raises(ValueError, match="world_size"):
        torch_compat.all_gather_single(torch.empty(3 * world + 2), torch.empty(3), group=g)
    with pytest.raises(TypeError, match="dtype"):
        torch_compat.all_gather_single(torch.empty(3 * world, dtype=torch.float64), torch.empty(3), group=g)
    with pytest.raises(ValueError, match="one tensor per rank"):
        g.allreduce([torch.ones(2), torch.ones(2)]).wait()
    with pytest.raises(ValueError, match="PREMUL_SUM needs a floating-point"):
        dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist._make_nccl_premul_sum(2.0), group=g)
    # The group still works after the errors (they were raised before anything was queued).
    x = make(rank, 9, torch.int64)
    want = gloo_reference(x, ringzero.ReduceOp.SUM, world)
    dist.all_reduce(x, group=g)
    check_equal(x, want, "all_reduce after bad arguments")


def body(rank, world, spans_hosts=False, sizes=SIZES):
    g = dist.new_group(backend="ringzero")
    backend = g._get_backend(torch.device("cpu"))
    assert backend.uses_shared_memory != spans_hosts and backend.runs_across_hosts == spans_hosts
    engines = hosts_engines()
    kind = engines[-1].kind if spans_hosts else None
    assert len(engines) == spans_hosts, engines  # the harness's gloo group has none
    for dtype in DTYPES:
        for n in sizes:
            reductions(rank, world, g, dtype, n)
            data_movement(rank, world, g, dtype, n)
    coalesced_and_special(rank, world, g)
    stats = ringzero.backend_stats(g)
    assert not stats["fallback"], f"an implemented op was handed to gloo: {stats}"
    assert set(stats["native"]) == IMPLEMENTED, stats
    if world > 1:  # across hosts: gloo's (the engine has no point-to-point of its own)
        point_to_point(rank, world, g, gloo_receives=spans_hosts)
    p2p = {"send", "recv"} if world > 1 else set()
    handed_on = fallbacks(rank, world, g) | (p2p if spans_hosts else set())
    stats = ringzero.backend_stats(g)
    assert set(stats["native"]) == IMPLEMENTED | (set() if spans_hosts else p2p), stats
    assert set(stats["fallback"]) == handed_on, stats
    bad_arguments(rank, world, g)
    return sum(stats["native"].values()), kind
