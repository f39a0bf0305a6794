"""Fuzz of the CUDA collectives against torch on the CPU (int64/float64, rounded once to the dtype):
random world (2-8), staging size, ring channels, blocks, dtype, op, algorithm and in-place-ness, with
counts around multiples of the staging slot, the two-shot slot, the ring slice and the ring iteration,
plus 0, 1 and primes, for all-reduce, reduce-scatter and all-gather. Inputs are small integers (in
{-2, -1, 1, 2} for products), so every result is exact and compared bit for bit.

  - simulated ranks (one process): RINGZERO_FUZZ_CASES cases (default 300);
  - N processes on one GPU through CUDA IPC (tests/helpers/run_cuda_ipc_fuzz.py), small sizes (contexts time-slice).
The seed is printed (pytest -s, or in the failure message); RINGZERO_FUZZ_SEED repeats a run. Skips
without CUDA (a skip is not a pass: benchmarks/gpu_check.sh runs it on a GPU). The C++ twin without
torch is tests/cpp/test_cuda_fuzz.cu (ctest).
"""

import pytest
import torch

import ringzero
from ringzero.comm import cuda as rz_cuda

from cuda_fuzz_cases import AG, AR, DTYPES, OPS, RING_STEPS, RS, fuzz_seed, fuzz_start, inputs, random_count
from cuda_util import check, gpu, reference, run_script

@gpu
def test_fuzz_simulated_ranks():
    seed, cases, rng, gen = fuzz_start("test_fuzz_simulated_ranks", 300)
    done = 0
    while done < cases:
        world = rng.randint(2, 8)
        staging = rng.choice([64 << 10, 128 << 10, 256 << 10, 1 << 20])
        channels = rng.randint(1, min(8, staging // (RING_STEPS * 4096)))
        blocks = rng.choice([1, 2, 3, 4, 8, 16, 32])
        sim = rz_cuda.simulated_world(world, staging_bytes=staging, ring_channels=channels, max_blocks=blocks,
                                      timeout_s=60)
        for _ in range(min(6, cases - done)):  # several cases per world: flags carry over between kernels
            done += 1
            coll = rng.choice([AR, AR, AR, RS, RS, AG])
            algo = rng.choice([0, 1, 2, 3]) if coll == AR else 0
            dtype = rng.choice(DTYPES)
            op = rng.choice(OPS) if coll != AG else ringzero.ReduceOp.SUM
            esize = torch.tensor([], dtype=dtype).element_size()
            n = random_count(rng, world, esize, staging, channels, coll, 1 << 20)
            in_place = coll == AR and rng.random() < 0.5
            tag = (f"seed {seed} case {done}: world={world} staging={staging} channels={channels} blocks={blocks} "
                   f"coll={coll} algo={algo} {dtype} {op.name} n={n}{' in-place' if in_place else ''}")
            xs = inputs(gen, world, n * (world if coll == RS else 1), dtype, op)
            if coll == AG:
                want = [torch.cat(xs)] * world
            elif coll == RS:
                full = reference(xs, op, world)
                want = [full[q * n:(q + 1) * n] for q in range(world)]
            else:
                want = [reference(xs, op, world)] * world
            dev = [x.cuda() for x in xs]
            out_n = n * (world if coll == AG else 1)
            outs = dev if in_place else [torch.full((out_n,), 7, dtype=dtype, device="cuda") for _ in range(world)]
            sim.run(coll, dev, outs, int(op), algo)
            torch.cuda.synchronize()
            sim.check()
            for q in range(world):
                check(outs[q].cpu(), want[q], f"{tag} rank {q}")
        del sim
    torch.cuda.synchronize()


@gpu
@pytest.mark.parametrize("world", [3, 5])
def test_fuzz_processes_through_ipc(world):
    """N processes on one GPU (real IPC handles, cross-process flags), small sizes; each rank computes
    every rank's inputs from the seed and checks against torch on the CPU."""
    seed = fuzz_seed()
    out = run_script("run_cuda_ipc_fuzz.py", str(world), str(seed), timeout_s=300)
    assert f"ok {world} ranks" in out, out
