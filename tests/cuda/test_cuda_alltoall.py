"""The CUDA all-to-all(v) kernel (csrc/cuda/alltoall.cu) against the blocks it must move, computed on the
CPU (rank r's output is block r of every rank's input, in rank order): every element compared bit for bit
(the kernel only moves bytes, so every dtype of 1, 2, 4 and 8 bytes is exact, floats included).

  - simulated ranks in one process (CudaSimWorld.all_to_all): a fuzz over 2-8 ranks, staging sizes,
    blocks per rank, dtypes and split sizes (even, uneven, zero-length blocks, a rank that sends nothing,
    totals around multiples of the staging slot, primes), several calls per world (the counters carry over);
  - N processes on one GPU through CUDA IPC (tests/helpers/run_cuda_ipc_alltoall.py): ringzero.all_to_all_single
    and all_to_all against gloo's on host copies, and split sizes that disagree between ranks raising
    CollectiveMismatch on every rank.
The seed is printed; RINGZERO_FUZZ_SEED repeats a run, RINGZERO_FUZZ_CASES sets the count (default 200).
Skips without CUDA (a skip is not a pass: benchmarks/gpu_check.sh runs it on a GPU). The CPU-grid twin
(every rank a thread, CI under ThreadSanitizer) is tests/cpp/test_cuda_alltoall.cu.
"""
import random

import pytest
import torch

from ringzero.comm import cuda as rz_cuda

from cuda_fuzz_cases import PRIMES, fuzz_seed, fuzz_start
from cuda_util import check, gpu, run_script

# Every element size the kernel moves; floats included (moved as bytes, so NaN patterns survive too).
DTYPES = [torch.uint8, torch.bool, torch.float16, torch.bfloat16, torch.int32, torch.float32, torch.int64,
          torch.float64]


def random_splits(rng: random.Random, world: int, slot: int) -> list[list[int]]:
    """splits[q][p]: what rank q sends rank p; a mix of zeros, ones, primes and sizes near the slot."""
    def one():
        pick = rng.random()
        if pick < 0.2:
            return 0
        if pick < 0.4:
            return rng.choice([1] + PRIMES[:5])
        return max(0, rng.choice([slot // world, slot, 2 * slot + 1, slot // 3]) + rng.randint(-17, 17))

    splits = [[one() for _ in range(world)] for _ in range(world)]
    if rng.random() < 0.2:
        splits[rng.randrange(world)] = [0] * world  # a rank that sends nothing
    return splits


def blocks_for(xs: list[torch.Tensor], splits: list[list[int]]) -> list[torch.Tensor]:
    """The reference: rank r's output is block r of every rank's input, in rank order."""
    world = len(xs)
    parts = [list(x.split(splits[q])) for q, x in enumerate(xs)]
    return [torch.cat([parts[q][r] for q in range(world)]) for r in range(world)]


def random_input(gen: torch.Generator, n: int, dtype) -> torch.Tensor:
    raw = torch.randint(0, 256, (n * torch.tensor([], dtype=dtype).element_size(),), dtype=torch.uint8, generator=gen)
    if dtype == torch.bool:
        return raw % 2 == 1
    return raw.view(dtype)  # any bit pattern: the kernel must move bytes, not values


@gpu
def test_all_to_all_fuzz_simulated_ranks():
    seed, cases, rng, gen = fuzz_start("test_all_to_all_fuzz_simulated_ranks", 200)
    done = 0
    while done < cases:
        world = rng.randint(2, 8)
        staging = rng.choice([96 << 10, 128 << 10, 256 << 10, 1 << 20])
        blocks = rng.choice([1, 2, 3, 4, 8, 16])
        sim = rz_cuda.simulated_world(world, staging_bytes=staging, ring_channels=1, max_blocks=blocks,
                                      timeout_s=60)
        for _ in range(min(5, cases - done)):  # several calls per world: the flags carry over between kernels
            done += 1
            dtype = rng.choice(DTYPES)
            esize = torch.tensor([], dtype=dtype).element_size()
            splits = random_splits(rng, world, staging // esize)
            tag = f"seed {seed} case {done}: world={world} staging={staging} blocks={blocks} {dtype} splits={splits}"
            xs = [random_input(gen, sum(row), dtype) for row in splits]
            want = blocks_for(xs, splits)
            ins = [x.cuda() for x in xs]
            outs = [torch.zeros(w.numel(), dtype=dtype, device="cuda") for w in want]
            counts = [torch.tensor(row, dtype=torch.int64, device="cuda") for row in splits]
            sim.all_to_all(ins, outs, counts)
            torch.cuda.synchronize()
            sim.check()
            for r in range(world):
                check(outs[r].cpu().view(torch.uint8), want[r].view(torch.uint8), f"{tag} rank {r}")
            for q in range(world):  # the input is read, never written
                check(ins[q].cpu().view(torch.uint8), xs[q].view(torch.uint8), f"{tag} input of rank {q}")
    assert done == cases


@gpu
def test_all_to_all_bad_arguments_name_the_argument():
    sim = rz_cuda.simulated_world(2, timeout_s=30)
    x = [torch.zeros(8, device="cuda") for _ in range(2)]
    good = [torch.tensor([4, 4], device="cuda") for _ in range(2)]
    with pytest.raises(ValueError, match="send_counts"):
        sim.all_to_all(x, [torch.zeros(8, device="cuda") for _ in range(2)], [torch.tensor([4, 4]) for _ in range(2)])
    with pytest.raises(TypeError, match="send_counts"):
        sim.all_to_all(x, [torch.zeros(8, device="cuda") for _ in range(2)],
                       [torch.tensor([4, 4], dtype=torch.int32, device="cuda") for _ in range(2)])
    with pytest.raises(ValueError, match="overlaps"):
        sim.all_to_all(x, x, good)
    with pytest.raises(ValueError, match="one input, one output and one send_counts"):
        sim.all_to_all(x[:1], x[:1], good[:1])


@gpu
@pytest.mark.parametrize("world", [2, 3])
def test_all_to_all_over_processes_matches_gloo(world):
    out = run_script("run_cuda_ipc_alltoall.py", str(world), env={"RINGZERO_FUZZ_SEED": str(fuzz_seed())})
    assert f"ok {world} ranks" in out, out
