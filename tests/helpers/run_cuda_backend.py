"""N processes sharing one GPU on init_process_group-style "ringzero" groups with CUDA tensors: run by
tests/cuda/test_backend_cuda.py in a fresh interpreter (python tests/helpers/run_cuda_backend.py N MODE).
  ops:    every routed op against a reference computed on the host from all ranks' inputs (integer-valued
          inputs: exact), async_op and stream ordering, the CUDA-aware future, the clear error where
          NCCL cannot serve, backend_stats;
  train:  stock DDP (built-in reduction, and torch's allreduce comm hook) and stock FSDP2 against one
          process training on the whole batch (run_backend_train.train_whole_batch);
  absent: the last rank never comes to the first CUDA collective (the CUDA rendezvous): the others
          raise ringzero.CommTimeout naming it;
  hosts:  the ranks on forced hosts of their own (a group spanning hosts): its CUDA collectives would
          run on the CUDA engine across hosts (NCCL rings), which NCCL refuses for ranks sharing a GPU, so
          each must raise a ValueError saying so, and the group's CPU collectives still run on the engine.
Prints 'ok N ranks MODE'."""
import os
import sys
import time

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
from harness import run_ranks  # noqa: E402

# cuda_util is imported in the ranks, never here: its torch.cuda.is_available() would mark this parent's
# CUDA as initialised, and every rank forked after it would fail with "Cannot re-initialize CUDA in
# forked subprocess" (seen on the H200, 2026-11-28).

SMALL = {"RINGZERO_CUDA_BUFFER_BYTES": str(256 << 10), "RINGZERO_CUDA_RING_CHANNELS": "2",
         "RINGZERO_CUDA_MAX_BLOCKS": "4", "RINGZERO_TIMEOUT_S": "120"}
ROUTED = ["allreduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
          "reduce_scatter_tensor", "allreduce_coalesced", "allgather_into_tensor_coalesced",
          "reduce_scatter_tensor_coalesced", "alltoall_base", "alltoall"]
# Final parameters against one process on the whole batch, after TRAIN_STEPS of AdamW (lr 1e-2): the
# float32 sums add in another order than the whole-batch loss does, and AdamW's normalised step turns
# last-bit differences into up to lr-sized ones. Not yet measured on a GPU; the CPU runs of the same
# models against gloo (tests/backend/test_backend_training.py) differ by about 5e-4 after 20 steps at 4 ranks.
TRAIN_STEPS = 10
TRAIN_ATOL = 5e-3


def ops(rank, world):
    import ringzero
    from cuda_util import check, make, reference
    from ringzero.comm import torch_compat

    torch.cuda.set_device(0)
    g = dist.new_group(backend="ringzero")
    R = ringzero.ReduceOp
    torch_op = {R.SUM: dist.ReduceOp.SUM, R.MIN: dist.ReduceOp.MIN, R.MAX: dist.ReduceOp.MAX, R.AVG: dist.ReduceOp.AVG}
    checks = 0
    for dtype in (torch.int32, torch.float32, torch.bfloat16):
        for n in (1, 13, 70_001):  # 70_001 x 4 B spans several 256 KiB staging slices
            tag = f"{dtype} n={n}"
            xs = [make(r, n, dtype, device="cpu") for r in range(world)]
            x = xs[rank].cuda()
            for op in (R.SUM, R.MIN, R.MAX) + ((R.AVG,) if dtype == torch.float32 else ()):
                want = reference(xs, op, world)
                got = x.clone()
                dist.all_reduce(got, op=torch_op[op], group=g)
                check(got.cpu(), want, f"all_reduce {op.name} {tag}")
                root = n % world
                got = x.clone()
                dist.reduce(got, dst=root, op=torch_op[op], group=g)
                check(got.cpu(), want if rank == root else xs[rank], f"reduce {op.name} {tag}")
            bigs = [make(r, n * world, dtype, device="cpu", salt=1) for r in range(world)]
            block = reference(bigs, R.SUM, world)[rank * n:(rank + 1) * n]
            out = torch.full((n,), 7, dtype=dtype, device="cuda")
            torch_compat.reduce_scatter_single(out, bigs[rank].cuda(), group=g)
            check(out.cpu(), block, f"reduce_scatter_tensor {tag}")
            out = torch.full((n,), 7, dtype=dtype, device="cuda")
            dist.reduce_scatter(out, list(bigs[rank].cuda().chunk(world)), group=g)
            check(out.cpu(), block, f"reduce_scatter (list) {tag}")
            gathered = torch.empty(n * world, dtype=dtype, device="cuda")
            torch_compat.all_gather_single(gathered, x, group=g)
            check(gathered.cpu(), torch.cat(xs), f"all_gather_into_tensor {tag}")
            outs = [torch.empty(n, dtype=dtype, device="cuda") for _ in range(world)]
            dist.all_gather(outs, x, group=g)
            check(torch.cat(outs).cpu(), torch.cat(xs), f"all_gather (list) {tag}")
            src = (n + 1) % world
            buf = x.clone() if rank == src else torch.zeros(n, dtype=dtype, device="cuda")
            dist.broadcast(buf, src=src, group=g)
            check(buf.cpu(), xs[src], f"broadcast {tag}")
            checks += 9
    # Broadcast moves any dtype (as 32-bit words, odd byte counts padded); a non-contiguous tensor too.
    for dtype, n in ((torch.float64, 5), (torch.uint8, 7), (torch.bool, 3)):
        want = (torch.arange(n) % 2 == 0).to(dtype)
        buf = want.cuda() if rank == 0 else torch.zeros(n, dtype=dtype, device="cuda")
        dist.broadcast(buf, src=0, group=g)
        check(buf.cpu(), want, f"broadcast {dtype}")
    # All-to-all on the CUDA kernel: any dtype, uneven splits (zero-length blocks too), against the blocks
    # every rank can rebuild; split sizes that disagree raise CollectiveMismatch on every rank before the
    # kernel runs ([Note: the CUDA all-to-all's counts]), and the group works after.
    splits = [[(q * 3 + p) % 4 * 1000 + p for p in range(world)] for q in range(world)]  # [q][p]: q sends p
    for dtype in (torch.float64, torch.bfloat16, torch.uint8, torch.int32):
        ins = [((torch.arange(sum(splits[q])) * 7 + q) % 251).to(dtype) for q in range(world)]
        want = torch.cat([ins[q].split(splits[q])[rank] for q in range(world)])
        recv = [splits[q][rank] for q in range(world)]
        got = torch.full((sum(recv),), 7, dtype=dtype, device="cuda")
        dist.all_to_all_single(got, ins[rank].cuda(), recv, splits[rank], group=g)
        check(got.cpu(), want, f"all_to_all_single {dtype}")
        outs = [torch.empty(c, dtype=dtype, device="cuda") for c in recv]
        dist.all_to_all(outs, [t.cuda() for t in ins[rank].split(splits[rank])], group=g)
        check(torch.cat(outs).cpu(), want, f"all_to_all (list) {dtype}")
    bad = [2] * world
    if rank == 0:
        bad[world - 1] = 3
    try:
        dist.all_to_all_single(torch.empty(sum(bad), device="cuda"), torch.ones(2 * world, device="cuda"), bad,
                               [2] * world, group=g)
        raise AssertionError("split sizes that disagree did not raise")
    except RuntimeError as e:
        assert f"group rank {world - 1} sends 2 elements to group rank 0, which expects 3" in str(e), str(e)
    even = torch.full((world,), float(rank), device="cuda")
    got = torch.empty(world, device="cuda")
    dist.all_to_all_single(got, even, group=g)
    check(got.cpu(), torch.arange(world, dtype=torch.float32), "all_to_all_single after a mismatch")
    strided = torch.zeros(6, 4, device="cuda")[:, 1]
    strided.fill_(rank + 1)
    dist.all_reduce(strided, group=g)
    check(strided.cpu(), torch.full((6,), float(sum(range(1, world + 1)))), "all_reduce of a strided view")
    # Coalesced forms (torch's coalescing manager hands the lists to the *_coalesced entry points).
    xs = [make(rank, n, torch.float32, salt=n) for n in (5, 300, 1)]
    with dist._coalescing_manager(group=g, device=torch.device("cuda")):
        for t in xs:
            dist.all_reduce(t, group=g)
    for t, n in zip(xs, (5, 300, 1)):
        check(t.cpu(), reference([make(r, n, torch.float32, "cpu", salt=n) for r in range(world)], R.SUM, world),
              "coalesced all_reduce")
    ins = [make(rank, n, torch.int32, salt=n) for n in (3, 700)]
    outs = [torch.empty(i.numel() * world, dtype=torch.int32, device="cuda") for i in ins]
    with dist._coalescing_manager(group=g, device=torch.device("cuda"), async_ops=True) as cm:
        for o, i in zip(outs, ins):
            torch_compat.all_gather_single(o, i, group=g)
    cm.wait()
    for o, i in zip(outs, ins):
        check(o.cpu(), torch.cat([make(q, i.numel(), torch.int32, "cpu", salt=i.numel()) for q in range(world)]),
              "coalesced all_gather_into_tensor")
    bigs = [make(rank, n * world, torch.int64, salt=n) for n in (2, 600)]
    outs = [torch.empty(b.numel() // world, dtype=torch.int64, device="cuda") for b in bigs]
    with dist._coalescing_manager(group=g, device=torch.device("cuda")):
        for o, b in zip(outs, bigs):
            torch_compat.reduce_scatter_single(o, b, op=dist.ReduceOp.MAX, group=g)
    for o, b in zip(outs, bigs):
        k = o.numel()
        ref = reference([make(q, b.numel(), torch.int64, "cpu", salt=k) for q in range(world)], R.MAX, world)
        check(o.cpu(), ref[rank * k:(rank + 1) * k], "coalesced reduce_scatter_tensor")
    # PREMUL_SUM (FSDP2's gradient divide factor): the sum of the premultiplied inputs.
    t = torch.full((999,), float(rank + 1), device="cuda")
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5), group=g)
    check(t.cpu(), torch.full((999,), 0.5 * sum(range(1, world + 1))), "PREMUL_SUM")

    # async_op on a side stream: the op starts after the work queued on the caller's stream (the fill),
    # wait() makes that stream wait (the mul runs after), and nothing waits on the host.
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        t = torch.empty(1 << 20, device="cuda")
        torch.cuda._sleep(50_000_000)  # a slow producer: a racing collective would read garbage
        t.fill_(rank + 1)
        work = dist.all_reduce(t, group=g, async_op=True)
        work.wait()
        t.mul_(2)
    torch.cuda.current_stream().wait_stream(side)
    check(t.cpu(), torch.full((1 << 20,), 2.0 * sum(range(1, world + 1))), "async all_reduce on a side stream")
    # The future is CUDA-aware: a callback's value is ordered after the collective (DDP comm hooks chain
    # on it), and wait() on it orders the current stream.
    t = torch.full((4096,), float(rank), device="cuda")
    fut = dist.all_reduce(t, group=g, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    check(fut.wait().cpu(), torch.full((4096,), 2.0 * sum(range(world))), "future chained on all_reduce")
    dist.barrier(group=g)  # a host barrier after CUDA work (waits for this rank's CUDA work first)

    # Ops NCCL would have to run cannot run with ranks sharing one GPU: a clear error naming the op.
    for name, call in [("allreduce", lambda: dist.all_reduce(torch.ones(3, dtype=torch.float64, device="cuda"), group=g)),
                       ("gather", lambda: dist.gather(torch.ones(3, device="cuda"), dst=0, group=g,
                                                      gather_list=[torch.ones(3, device="cuda") for _ in range(world)]
                                                      if rank == 0 else None))]:
        try:
            call()
            raise AssertionError(f"{name} ran on a GPU shared by several ranks")
        except (ValueError, RuntimeError) as e:
            assert f"ringzero {name}" in str(e) and "share one GPU" in str(e), str(e)
    torch.cuda.synchronize()
    stats = ringzero.backend_stats(g, device="cuda")
    assert set(ROUTED) <= set(stats["native"]), stats
    assert not stats["fallback"], stats  # the refused ops above raise before they are handed on
    assert "barrier" in ringzero.backend_stats(g)["native"], ringzero.backend_stats(g)
    return checks


def train(rank, world):
    import functools

    import ringzero
    from run_backend_train import train_ddp, train_fsdp2, train_whole_batch

    torch.cuda.set_device(0)
    g = dist.new_group(backend="ringzero")
    ref = train_whole_batch(world, TRAIN_STEPS, device="cuda")
    diffs = {}
    for name, fn in [("ddp", train_ddp), ("ddp+allreduce_hook", functools.partial(train_ddp, python_hook=True)),
                     ("fsdp2", train_fsdp2)]:
        ours = fn(g, TRAIN_STEPS, device="cuda")
        diffs[name] = (ours.cpu() - ref.cpu()).abs().max().item()
        assert diffs[name] <= TRAIN_ATOL, f"rank {rank} {name}: max |ringzero - whole batch| {diffs[name]} > {TRAIN_ATOL}"
    stats = ringzero.backend_stats(g, device="cuda")
    assert not stats["fallback"], stats
    for op in ("allreduce", "all_gather_into_tensor", "reduce_scatter_tensor"):
        assert stats["native"].get(op, 0) >= TRAIN_STEPS, stats
    print(f"rank {rank}/{world}: max |diff| against one process on the whole batch: {diffs}", flush=True)
    return diffs


def train_compiled(rank, world):
    """Stock DDP under torch.compile (dynamo's DDPOptimizer, inductor) with CUDA tensors on "ringzero"."""
    import functools

    import ringzero
    from run_backend_train import train_ddp, train_whole_batch

    torch.cuda.set_device(0)
    g = dist.new_group(backend="ringzero")
    ref = train_whole_batch(world, TRAIN_STEPS, device="cuda")
    ours = functools.partial(train_ddp, compile=True)(g, TRAIN_STEPS, device="cuda")
    diff = (ours.cpu() - ref.cpu()).abs().max().item()
    assert diff <= TRAIN_ATOL, f"rank {rank} ddp+compile: max |ringzero - whole batch| {diff} > {TRAIN_ATOL}"
    stats = ringzero.backend_stats(g, device="cuda")
    assert not stats["fallback"] and stats["native"].get("allreduce", 0) >= TRAIN_STEPS, stats
    print(f"rank {rank}/{world}: compiled DDP, max |diff| against one process on the whole batch: {diff}", flush=True)
    return diff


def absent(rank, world):
    import ringzero

    torch.cuda.set_device(0)
    g = dist.new_group(backend="ringzero")  # every rank: the C++ backend's own setup
    missing = world - 1
    if rank != missing:
        t0 = time.monotonic()
        with pytest.raises(ringzero.CommTimeout, match=rf"group ranks \[{missing}\] did not arrive"):
            dist.all_reduce(torch.ones(8, device="cuda"), group=g)
        assert time.monotonic() - t0 < 30
    dist.barrier()  # on the harness's gloo group: the missing rank waits here for the others
    return True


def hosts(rank, world):
    import ringzero

    torch.cuda.set_device(0)
    g = dist.new_group(backend="ringzero")
    for call in (lambda: dist.all_reduce(torch.ones(8, device="cuda"), group=g),
                 lambda: dist.all_gather_into_tensor(torch.empty(8 * world, device="cuda"),
                                                     torch.ones(8, device="cuda"), group=g)):
        with pytest.raises(ValueError, match="spanning hosts whose ranks share a GPU"):
            call()
    x = torch.full((1031,), float(rank))
    dist.all_reduce(x, group=g)
    assert bool((x == sum(range(world))).all()), x[:4]
    assert ringzero.backend_stats(g)["native"].get("allreduce", 0) == 1, ringzero.backend_stats(g)
    return True


if __name__ == "__main__":
    world, mode = int(sys.argv[1]), sys.argv[2]
    env = dict(SMALL, RINGZERO_TIMEOUT_S="3") if mode == "absent" else SMALL
    if mode == "hosts":
        env = dict(SMALL, RINGZERO_HOST_IDS=",".join(f"h{r}" for r in range(world)))
    modes = {"ops": ops, "train": train, "train_compiled": train_compiled, "absent": absent, "hosts": hosts}
    results = run_ranks(world, modes[mode], env=env, timeout_s=540)
    assert all(results), results
    print(f"ok {world} ranks {mode}: {results[0]}")
