"""N processes sharing one GPU through CUDA IPC: ringzero.all_to_all_single and all_to_all on CUDA tensors
against gloo's all_to_all_single on host copies, and split sizes that disagree raising CollectiveMismatch on
every rank. Run by tests/cuda/test_cuda_alltoall.py in a fresh interpreter
(python tests/helpers/run_cuda_ipc_alltoall.py N). Prints the seed and 'ok N ranks'."""
import os
import random
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
from harness import run_ranks  # noqa: E402

SMALL = {"RINGZERO_CUDA_BUFFER_BYTES": str(256 << 10), "RINGZERO_CUDA_MAX_BLOCKS": "4", "RINGZERO_TIMEOUT_S": "120"}


def body(rank, world):
    import ringzero

    torch.cuda.set_device(0)
    seed = int(os.environ["RINGZERO_FUZZ_SEED"])
    rng = random.Random(seed)  # the same draws on every rank: every rank knows every rank's splits
    group = dist.new_group(list(range(world)))
    checks = 0
    for case in range(12):
        dtype = rng.choice([torch.float32, torch.bfloat16, torch.int64, torch.float64, torch.uint8])
        rows = rng.choice([1, 3, 8])
        splits = [[rng.choice([0, 1, 7, 1031, 70_001 // rows]) for _ in range(world)] for _ in range(world)]
        send = splits[rank]
        recv = [splits[q][rank] for q in range(world)]
        i = torch.arange(sum(send) * rows, dtype=torch.int64)
        x = ((i * 5 + rank * 3 + case) % 251).to(dtype).view(sum(send), rows)
        ref = torch.empty(sum(recv), rows, dtype=dtype)
        dist.all_to_all_single(ref, x, recv, send)  # gloo on the default group, host memory
        got = torch.full((sum(recv), rows), 7, dtype=dtype, device="cuda")
        work = ringzero.all_to_all_single(got, x.cuda(), recv, send, group=group, async_op=case % 2 == 1)
        if work is not None:
            work.wait()
        assert torch.equal(got.cpu(), ref), f"seed {seed} case {case}: {dtype} splits {splits}"
        checks += 1
    # The list form, uneven.
    ins = [torch.full((q + 1 + rank,), rank * 10 + q, dtype=torch.int32, device="cuda") for q in range(world)]
    outs = [torch.empty(rank + 1 + q, dtype=torch.int32, device="cuda") for q in range(world)]
    ringzero.all_to_all(outs, ins, group=group)
    for q in range(world):
        assert torch.equal(outs[q].cpu(), torch.full((rank + 1 + q,), q * 10 + rank, dtype=torch.int32)), q
    checks += 1
    # Split sizes that disagree: rank 0 expects one element more from rank 1 than rank 1 sends it.
    recv = [2] * world
    if rank == 0:
        recv[1] = 3
    try:
        ringzero.all_to_all_single(torch.empty(sum(recv), device="cuda"), torch.ones(2 * world, device="cuda"), recv,
                                   [2] * world, group=group)
    except ringzero.CollectiveMismatch as e:
        assert "group rank 1 sends 2 elements to group rank 0, which expects 3" in str(e), str(e)
        checks += 1
    else:
        raise AssertionError("split sizes that disagree did not raise CollectiveMismatch")
    return checks


if __name__ == "__main__":
    n = int(sys.argv[1])
    print(f"RINGZERO_FUZZ_SEED={os.environ['RINGZERO_FUZZ_SEED']}")
    counts = run_ranks(n, body, env=SMALL, timeout_s=300)
    assert all(c == 14 for c in counts), counts
    print(f"ok {n} ranks")
