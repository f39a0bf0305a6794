"""The CUDA path against torch's own arithmetic on the same GPU.

Reference: torch sums/min/max/prod of the stacked rank inputs in float64/int64, rounded once to the
dtype (exact for the small integers used here, so results must match bit for bit; 16-bit products on
the ring round once per step and get a tolerance of n roundings; random floats get one float32
rounding per rank of tolerance), gloo's all_reduce on host copies for the multi-process IPC test, and
the same op run eagerly for CUDA-graph replay. Covered: simulated ranks (N = 2, 3, 4, 8) for every
kernel, graph capture and replay, the NCCL ring driver over the loopback transport, N processes on
one GPU through CUDA IPC (N = 2, 4; small sizes). Every GPU test skips cleanly without CUDA; the first
test runs everywhere and checks what a build without CUDA says.
"""
import pytest
import torch

import ringzero
from ringzero import _C
from ringzero.comm import cuda as rz_cuda

from cuda_util import check, gpu, make, reference, run_script

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64]
OPS = [ringzero.ReduceOp.SUM, ringzero.ReduceOp.AVG, ringzero.ReduceOp.MIN, ringzero.ReduceOp.MAX,
       ringzero.ReduceOp.PRODUCT]
ALGOS = {"oneshot": 1, "twoshot": 2, "ring": 3}
AR, RS, AG = rz_cuda.ALL_REDUCE, rz_cuda.REDUCE_SCATTER, rz_cuda.ALL_GATHER


def test_build_without_cuda_says_so():
    """Runs everywhere: a CPU build refuses CUDA tensors with a ValueError naming the fix."""
    if getattr(_C, "has_cuda", False):
        assert isinstance(_C.has_nccl, bool)
        return
    with pytest.raises(ValueError, match="no CUDA path"):
        rz_cuda.check_available("all_reduce", "tensor")


def test_other_devices_are_refused():
    """Runs everywhere: a tensor that is neither CPU nor CUDA gets a ValueError naming the fix."""
    with pytest.raises(ValueError, match="CPU and CUDA tensors only"):
        ringzero.all_reduce(torch.ones(3, device="meta"))


@gpu
@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_simulated_ranks_match_torch(world):
    sim = rz_cuda.simulated_world(world, staging_bytes=256 << 10, ring_channels=4, max_blocks=8, timeout_s=60)
    for dtype in DTYPES:
        for op in OPS:
            for n in [1, 13, 1031, 300_007]:
                if n > 2000 and op != ringzero.ReduceOp.SUM:
                    continue  # the large size streams through the staging buffer; one op is enough
                xs = [make(q, n, dtype) for q in range(world)]
                want = reference(xs, op, world)
                rounded = dtype in (torch.bfloat16, torch.float16) and op == ringzero.ReduceOp.PRODUCT
                for name, algo in ALGOS.items():
                    outs = [torch.full_like(x, 7) for x in xs]
                    sim.run(AR, xs, outs, int(op), algo)
                    for q in range(world):
                        check(outs[q], want, f"sim{world} {name} {dtype} {op.name} n={n} rank {q}",
                              rounded and name == "ring", world)
                big = [make(q, n * world, dtype, salt=1) for q in range(world)]
                full = reference(big, op, world)
                outs = [torch.empty(n, dtype=dtype, device="cuda") for _ in range(world)]
                sim.run(RS, big, outs, int(op), 0)
                for q in range(world):
                    check(outs[q], full[q * n:(q + 1) * n], f"sim{world} reduce_scatter {dtype} {op.name} n={n}",
                          rounded, world)
        for n in [1, 13, 1031, 300_007]:
            xs = [make(q, n, dtype) for q in range(world)]
            outs = [torch.empty(n * world, dtype=dtype, device="cuda") for _ in range(world)]
            sim.run(AG, xs, outs, 0, 0)
            for q in range(world):
                check(outs[q], torch.cat(xs), f"sim{world} all_gather {dtype} n={n}")
    torch.cuda.synchronize()


@gpu
def test_random_floats_bitwise_identical_across_ranks():
    world, n = 8, 77_777
    sim = rz_cuda.simulated_world(world, staging_bytes=256 << 10, ring_channels=4, max_blocks=8, timeout_s=60)
    g = torch.Generator(device="cuda").manual_seed(3)
    xs = [torch.randn(n, device="cuda", generator=g) for _ in range(world)]
    ref = torch.stack([x.double() for x in xs]).sum(0)
    mag = torch.stack([x.double().abs() for x in xs]).sum(0)
    for name, algo in ALGOS.items():
        outs = [torch.empty_like(x) for x in xs]
        sim.run(AR, xs, outs, int(ringzero.ReduceOp.SUM), algo)
        assert ((outs[0].double() - ref).abs() <= world * 2 ** -23 * mag).all(), name
        for q in range(1, world):
            assert torch.equal(outs[q], outs[0]), f"{name}: rank {q} differs from rank 0"


@gpu
def test_cuda_graph_capture_and_replay():
    world, n = 4, 40_009
    sim = rz_cuda.simulated_world(world, staging_bytes=256 << 10, ring_channels=4, max_blocks=8, timeout_s=60)
    xs = [make(q, n, torch.int32) for q in range(world)]
    for name, algo in ALGOS.items():
        outs = [torch.empty_like(x) for x in xs]
        sim.run(AR, xs, outs, int(ringzero.ReduceOp.SUM), algo)  # warm-up outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            sim.run(AR, xs, outs, int(ringzero.ReduceOp.SUM), algo)
        for replay in range(3):
            for q in range(world):
                xs[q].copy_(make(q, n, torch.int32, salt=replay + 1))
            graph.replay()
            torch.cuda.synchronize()
            want = reference(xs, ringzero.ReduceOp.SUM, world)
            for q in range(world):
                check(outs[q], want, f"graph {name} replay {replay} rank {q}")


@gpu
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_loopback_ring_driver(world):
    ring = _C.LoopbackRing(world, 4096)  # small slices: many pipelined steps
    for dtype in [torch.float32, torch.bfloat16, torch.int32, torch.int64]:
        for op in [ringzero.ReduceOp.SUM, ringzero.ReduceOp.AVG, ringzero.ReduceOp.MAX]:
            for n in [0, 1, 13, 70_001]:
                xs = [make(q, n, dtype) for q in range(world)]
                want = reference(xs, op, world) if n else xs[0]
                bufs = [x.clone() for x in xs]
                ring.all_reduce(bufs, int(op))
                big = [make(q, n * world, dtype, salt=1) for q in range(world)]
                outs = [torch.empty(n, dtype=dtype, device="cuda") for _ in range(world)]
                ring.reduce_scatter(big, [torch.empty_like(b) for b in big], outs, int(op))
                gathered = [torch.empty(n * world, dtype=dtype, device="cuda") for _ in range(world)]
                ring.all_gather(xs, gathered)
                torch.cuda.synchronize()
                full = reference(big, op, world) if n else big[0]
                for q in range(world):
                    check(bufs[q], want, f"loopback{world} all_reduce {dtype} {op.name} n={n}")
                    check(outs[q], full[q * n:(q + 1) * n], f"loopback{world} reduce_scatter {dtype} {op.name} n={n}")
                    check(gathered[q], torch.cat(xs), f"loopback{world} all_gather {dtype} n={n}")


@gpu
@pytest.mark.parametrize("world", [2, 4])
def test_processes_on_one_gpu_through_ipc(world):
    """N processes on one GPU, real IPC handles and cross-process flags (contexts time-slice: small
    sizes only, never timed). Runs in a fresh interpreter: this one has initialised CUDA, and forked
    children could not."""
    out = run_script("run_cuda_ipc.py", str(world), timeout_s=900)
    assert f"ok {world} ranks" in out
