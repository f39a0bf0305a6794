"""The fuzz's random draws, shared by tests/cuda/test_cuda_fuzz.py and tests/helpers/run_cuda_ipc_fuzz.py (never imported
from a test file): dtypes, ops, exact small-integer inputs and counts near the units the CUDA kernels
stream by."""
import os
import random
import time

import torch

import ringzero
from ringzero.comm import cuda as rz_cuda

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64]
OPS = [ringzero.ReduceOp.SUM, ringzero.ReduceOp.AVG, ringzero.ReduceOp.MIN, ringzero.ReduceOp.MAX,
       ringzero.ReduceOp.PRODUCT]
AR, RS, AG = rz_cuda.ALL_REDUCE, rz_cuda.REDUCE_SCATTER, rz_cuda.ALL_GATHER
PRIMES = [2, 3, 13, 1031, 4099, 65537, 100_003]
RING_STEPS = 4  # csrc/cuda/peer_types.h kRingSteps


def fuzz_seed() -> int:
    return int(os.environ.get("RINGZERO_FUZZ_SEED", time.time_ns() % 2**32))


def fuzz_start(test: str, default_cases: int):
    """A fuzz test's seed (printed with the case count, so a failure can be repeated), its case count
    (RINGZERO_FUZZ_CASES), and the two generators drawn from the seed: (seed, cases, rng, gen)."""
    seed, cases = fuzz_seed(), int(os.environ.get("RINGZERO_FUZZ_CASES", str(default_cases)))
    print(f"{test}: RINGZERO_FUZZ_SEED={seed} RINGZERO_FUZZ_CASES={cases}")
    return seed, cases, random.Random(seed), torch.Generator().manual_seed(seed)


def inputs(gen: torch.Generator, world: int, n: int, dtype, op) -> list[torch.Tensor]:
    """Per rank: small nonzero integers, in {-2, -1, 1, 2} for products (exact in 16 bits for 8 ranks)."""
    values = torch.tensor([-2, -1, 1, 2] if op == ringzero.ReduceOp.PRODUCT else [-3, -2, -1, 1, 2, 3])
    return [values[torch.randint(len(values), (n,), generator=gen)].to(dtype) for _ in range(world)]


def random_count(rng: random.Random, world: int, esize: int, staging: int, channels: int, coll: int,
                 most: int) -> int:
    """Near a multiple of a unit the kernels stream by, or 0, 1 or a prime; at most `most`."""
    if rng.random() < 0.2:
        return rng.choice([0, 1] + PRIMES)
    pack = 16 // esize
    slot = staging // esize
    ring_slice = staging // (channels * RING_STEPS) // 16 * 16 // esize
    unit = rng.choice([slot, slot // (world * pack) * (world * pack), ring_slice, ring_slice * channels,
                       ring_slice * channels * world])
    count = rng.randint(1, 4) * unit + rng.randint(-pack - 1, pack + 1)
    limit = most // (1 if coll == AR else world)
    return max(0, count if count <= limit else limit - rng.randint(0, 96))
