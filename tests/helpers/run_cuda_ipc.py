"""N processes sharing one GPU through CUDA IPC, each checked against gloo on host copies: run by
tests/cuda/test_cuda.py in a fresh interpreter (python tests/helpers/run_cuda_ipc.py N). Prints 'ok N ranks'."""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
from harness import run_ranks  # noqa: E402

SMALL = {"RINGZERO_CUDA_BUFFER_BYTES": str(256 << 10), "RINGZERO_CUDA_RING_CHANNELS": "2",
         "RINGZERO_CUDA_MAX_BLOCKS": "4", "RINGZERO_TIMEOUT_S": "120"}


def body(rank, world):
    import ringzero

    torch.cuda.set_device(0)
    checks = 0
    for algo in ["oneshot", "twoshot", "ring"]:
        os.environ["RINGZERO_ALLREDUCE_ALGO"] = algo
        group = dist.new_group(list(range(world)))
        for dtype in [torch.int32, torch.bfloat16]:
            for n in [1, 13, 70_001]:  # 70_001 x 4 B spans several 256 KiB staging slices
                i = torch.arange(n, dtype=torch.int64)
                x = ((i * 5 + rank * 3) % 7 - 3).to(dtype)
                for op, gop in [(ringzero.ReduceOp.SUM, dist.ReduceOp.SUM), (ringzero.ReduceOp.MAX, dist.ReduceOp.MAX)]:
                    ref = x.double() if dtype.is_floating_point else x.long()
                    dist.all_reduce(ref, op=gop)  # gloo on the default group, host memory
                    got = x.cuda()
                    ringzero.all_reduce(got, op=op, group=group)
                    assert torch.equal(got.cpu(), ref.to(dtype)), f"{algo} {dtype} n={n} {op.name}"
                    checks += 1
        out = torch.empty(13 * world, dtype=torch.int32, device="cuda")
        ringzero.all_gather_into_tensor(out, torch.full((13,), rank, dtype=torch.int32, device="cuda"), group=group)
        assert torch.equal(out.cpu(), torch.arange(world, dtype=torch.int32).repeat_interleave(13))
        big = torch.arange(13 * world, dtype=torch.int32, device="cuda") + rank
        part = torch.empty(13, dtype=torch.int32, device="cuda")
        work = ringzero.reduce_scatter_tensor(part, big, group=group, async_op=True)
        work.wait()
        want = (torch.arange(13 * world, dtype=torch.int32) * world + sum(range(world)))[rank * 13:(rank + 1) * 13]
        assert torch.equal(part.cpu(), want), f"{algo} reduce_scatter"
        checks += 2
    # Capture a blocking all_reduce into a CUDA graph (after a warm-up that set the path up).
    x = torch.ones(4099, device="cuda")
    ringzero.all_reduce(x, group=group)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ringzero.all_reduce(x, group=group)
    for k in range(3):
        x.fill_(k + rank)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(x.cpu(), torch.full((4099,), float(k * world + sum(range(world))))), f"graph replay {k}"
        checks += 1
    return checks


if __name__ == "__main__":
    world = int(sys.argv[1])
    results = run_ranks(world, body, env=SMALL, timeout_s=800)
    assert all(r > 0 for r in results), results
    print(f"ok {world} ranks, {results[0]} checks each")
