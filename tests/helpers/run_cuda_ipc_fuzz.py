"""N processes sharing one GPU through CUDA IPC, random cases against torch on the CPU: run by
tests/cuda/test_cuda_fuzz.py in a fresh interpreter (python tests/helpers/run_cuda_ipc_fuzz.py N SEED). Every rank draws
the same cases from SEED and computes every rank's inputs, so each checks its own output locally.
Small sizes: contexts time-slice, so every barrier costs context switches. Prints 'ok N ranks'."""
import os
import random
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
from harness import run_ranks  # noqa: E402

# One group per configuration: the algorithm is read when the group's communicator is made, the
# RINGZERO_CUDA_* sizes when its CUDA path is (its first CUDA collective).
CONFIGS = [("oneshot", 64 << 10, 2, 3), ("twoshot", 64 << 10, 2, 4), ("ring", 64 << 10, 3, 2),
           ("auto", 256 << 10, 2, 8)]
CASES_PER_CONFIG = 12


def body(rank, world, seed):
    import ringzero
    from cuda_util import check, reference
    from cuda_fuzz_cases import DTYPES, OPS, inputs, random_count

    torch.cuda.set_device(0)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    checks = 0
    for algo, staging, channels, blocks in CONFIGS:
        os.environ.update(RINGZERO_ALLREDUCE_ALGO=algo, RINGZERO_CUDA_BUFFER_BYTES=str(staging),
                          RINGZERO_CUDA_RING_CHANNELS=str(channels), RINGZERO_CUDA_MAX_BLOCKS=str(blocks))
        group = dist.new_group(list(range(world)))
        for case in range(CASES_PER_CONFIG):
            kind = rng.choice(["all_reduce", "all_reduce", "reduce_scatter", "all_gather"])
            dtype = rng.choice(DTYPES)
            op = rng.choice(OPS) if kind != "all_gather" else ringzero.ReduceOp.SUM
            esize = torch.tensor([], dtype=dtype).element_size()
            coll = {"all_reduce": 0, "reduce_scatter": 1, "all_gather": 2}[kind]
            n = random_count(rng, world, esize, staging, channels, coll, 40_000)
            tag = f"seed {seed} {algo} staging={staging} case {case}: {kind} {dtype} {op.name} n={n} rank {rank}"
            xs = inputs(gen, world, n * (world if kind == "reduce_scatter" else 1), dtype, op)
            x = xs[rank].cuda()
            if kind == "all_reduce":
                want = reference(xs, op, world)  # before the call: x may share xs[rank]'s memory
                ringzero.all_reduce(x, op=op, group=group)
                got = x
            elif kind == "reduce_scatter":
                got = torch.full((n,), 7, dtype=dtype, device="cuda")
                work = ringzero.reduce_scatter_tensor(got, x, op=op, group=group, async_op=rng.random() < 0.5)
                if work is not None:
                    work.wait()
                want = reference(xs, op, world)[rank * n:(rank + 1) * n]
            else:
                got = torch.full((n * world,), 7, dtype=dtype, device="cuda")
                work = ringzero.all_gather_into_tensor(got, x, group=group, async_op=rng.random() < 0.5)
                if work is not None:
                    work.wait()
                want = torch.cat(xs)
            torch.cuda.synchronize()
            check(got.cpu(), want, tag)
            checks += 1
    return checks


if __name__ == "__main__":
    world, seed = int(sys.argv[1]), int(sys.argv[2])
    print(f"run_cuda_ipc_fuzz: {world} ranks, RINGZERO_FUZZ_SEED={seed}", flush=True)
    results = run_ranks(world, body, seed, env={"RINGZERO_TIMEOUT_S": "60"}, timeout_s=280)
    assert all(r > 0 for r in results), results
    print(f"ok {world} ranks, {results[0]} checks each (seed {seed})")
