"""Registered tensors ([Note: registered tensors], csrc/core/shm_window.cpp): tensors from ringzero.empty,
which all_reduce, reduce_scatter and all_gather read from the peers' memory directly. Reference: what the
ranks' inputs make, computed by every rank from the same formulas (integers: exact; AVG of integers
truncates toward zero, as NCCL's), and, where a size stays staged, the same.

- Sizes on both sides of each op's threshold (64 KiB of input; the all-reduce from where Auto takes the
  two-shot), primes past it, a part of a tensor at the same offset on every rank, all-gather blocks and a
  reduce-scatter output past 16 MiB (streaming stores); int32, int64 and float32; SUM, MAX, AVG; blocking
  and async; worlds 2-4.
- Which path ran is read from the communicator's own record (kinds *_registered).
- No rank returns while a peer may still read its tensor: each rank changes its tensor right after every
  call, and every next call's result must show only the new values.
- A rank with a plain tensor where its peers pass registered ones, or another part of the allocation:
  CollectiveMismatch on every rank, and the group works afterwards. A tensor of another group:
  ValueError. Through the c10d backend ("ringzero" group of the same ranks): the same results. One
  rank alone: a plain tensor. /dev/shm too small: an error on every rank naming it.
"""
import random

import pytest
import torch
import torch.distributed as dist

import ringzero
from ringzero import _C
from harness import run_ranks
from ringzero.comm.communicator import get_communicator

MIN = _C.CPU_THRESHOLDS["registered_min_bytes"]  # the selector's (csrc/core/select.h)
ONE_SHOT_MAX = _C.CPU_THRESHOLDS["one_shot_max_bytes"]  # the all-reduce's one-shot limit


def values(rank: int, count: int, dtype, generation: int = 0) -> torch.Tensor:
    """Rank `rank`'s input: distinct per element, rank and generation; small enough to sum exactly."""
    v = (torch.arange(count, dtype=torch.int64) * 7 + rank * 101 + generation * 13) % 1000 - 300
    return v.to(dtype)


def reduced(world: int, count: int, dtype, op: str, generation: int = 0) -> torch.Tensor:
    stack = torch.stack([values(q, count, torch.int64, generation) for q in range(world)])
    if op == "max":
        return stack.max(0).values.to(dtype)
    total = stack.sum(0)
    if op == "sum":
        return total.to(dtype)
    if dtype.is_floating_point:  # AVG: the sum divided once
        return total.to(dtype) / world
    return torch.div(total, world, rounding_mode="trunc").to(dtype)


OPS = {"sum": ringzero.ReduceOp.SUM, "max": ringzero.ReduceOp.MAX, "avg": ringzero.ReduceOp.AVG}


def kinds_since(comm, seq: int) -> list[str]:
    return [r[1] for r in comm.shm.history() if r[0] > seq]


def _correct_cases(rank, world, seed):
    print(f"seed {seed}")
    rng = random.Random(seed)
    comm = get_communicator(dist.group.WORLD)
    checked = 0
    for dtype in (torch.int32, torch.int64, torch.float32):
        es = dtype.itemsize
        # all_reduce: the one-shot's limit (staged), just past it, a prime count, a few MiB.
        for count, direct in ((ONE_SHOT_MAX // es, False), (ONE_SHOT_MAX // es + 1, True), (100_003, True),
                              ((3 << 20) // es + 5, True)):
            for op in ("sum", "max", "avg"):
                async_op = rng.random() < 0.5
                x = ringzero.empty(count + 3, dtype=dtype)
                part = x[3:]  # the same part of the allocation on every rank
                part.copy_(values(rank, count, dtype))
                seq = comm.shm.seq
                work = ringzero.all_reduce(part, OPS[op], async_op=async_op)
                if async_op:
                    work.wait()
                assert torch.equal(part, reduced(world, count, dtype, op)), (dtype, count, op)
                assert kinds_since(comm, seq)[-1] == ("all_reduce_registered" if direct else "all_reduce"), (count, op)
                checked += 1
        # reduce_scatter: the whole input just under 64 KiB (staged), at it, prime blocks, a few MiB.
        for block in (MIN // es // world - 1, -(-MIN // es // world), 10_007, (2 << 20) // es + 3):
            direct = block * world * es >= MIN
            for op in ("sum", "avg"):
                inp = ringzero.empty(block * world, dtype=dtype)
                inp.copy_(values(rank, block * world, dtype))
                out = torch.full((block + 1,), -1, dtype=dtype)
                seq = comm.shm.seq
                ringzero.reduce_scatter_tensor(out[:block], inp, OPS[op])
                want = reduced(world, block * world, dtype, op)[rank * block:(rank + 1) * block]
                assert torch.equal(out[:block], want), (dtype, block, op)
                assert out[-1].item() == -1, "wrote past the output"
                assert torch.equal(inp, values(rank, block * world, dtype)), "the input changed"
                assert kinds_since(comm, seq)[-1] == ("reduce_scatter_registered" if direct else "reduce_scatter")
                checked += 1
    # reduce_scatter with an output past 16 MiB (reduced in pieces, written with streaming stores).
    block = (16 << 20) // 4 + 5
    inp = ringzero.empty(block * world, dtype=torch.int32)
    inp.copy_(values(rank, block * world, torch.int32))
    out = torch.empty(block, dtype=torch.int32)
    ringzero.reduce_scatter_tensor(out, inp)
    assert torch.equal(out, reduced(world, block * world, torch.int32, "sum")[rank * block:(rank + 1) * block])
    del inp
    checked += 1
    # all_gather: blocks under and at 64 KiB, a prime, and past 16 MiB (streaming stores).
    for block, dtype in ((MIN // 4 - 1, torch.int32), (MIN // 4, torch.int32), (100_019, torch.int64),
                         ((16 << 20) // 4 + 9, torch.int32)):
        direct = block * dtype.itemsize >= MIN
        want = torch.cat([values(q, block, dtype) for q in range(world)])
        mine = ringzero.empty(block, dtype=dtype)
        mine.copy_(values(rank, block, dtype))
        out = torch.full((world * block + 1,), -1, dtype=dtype)
        seq = comm.shm.seq
        ringzero.all_gather_into_tensor(out[:-1], mine, async_op=True).wait()
        assert torch.equal(out[:-1], want) and out[-1].item() == -1, block
        assert kinds_since(comm, seq)[-1] == ("all_gather_registered" if direct else "all_gather")
        checked += 1
    # Inputs changed right after each call: each call sees only its own generation.
    count = (256 << 10) // 4 + 1
    x, g = ringzero.empty(count, dtype=torch.int32), ringzero.empty(count * world, dtype=torch.int32)
    gathered, piece = torch.empty(count * world, dtype=torch.int32), torch.empty(count, dtype=torch.int32)
    for generation in range(30):
        x.copy_(values(rank, count, torch.int32, generation))
        ringzero.all_reduce(x)
        assert torch.equal(x, reduced(world, count, torch.int32, "sum", generation)), generation
        x.copy_(values(rank, count, torch.int32, generation))
        ringzero.all_gather_into_tensor(gathered, x)
        x.fill_(-7)  # at once: a peer still reading would see it
        want = torch.cat([values(q, count, torch.int32, generation) for q in range(world)])
        assert torch.equal(gathered, want), f"generation {generation}: a peer read a tensor that had changed"
        g.copy_(values(rank, count * world, torch.int32, generation))
        ringzero.reduce_scatter_tensor(piece, g)
        g.fill_(-7)
        want = reduced(world, count * world, torch.int32, "sum", generation)[rank * count:(rank + 1) * count]
        assert torch.equal(piece, want), f"generation {generation}"
        checked += 1
    return checked


@pytest.mark.parametrize("world", [2, 3, 4])
def test_registered_collectives_match_the_reference(world):
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    got = run_ranks(world, _correct_cases, seed, timeout_s=600)
    assert got == [got[0]] * world and got[0] == 36 + 24 + 1 + 4 + 30, got


def _mismatch_cases(rank, world):
    count = (1 << 20) // 4
    reg = ringzero.empty(count * 2, dtype=torch.float32)
    # Rank 0 passes a plain tensor where rank 1 passes its registered one.
    t = torch.ones(count) if rank == 0 else reg[:count].fill_(1)
    with pytest.raises(ringzero.CollectiveMismatch, match="all_reduce_registered(.|\n)*plain tensor"):
        ringzero.all_reduce(t)
    # Another part of the allocation on each rank.
    with pytest.raises(ringzero.CollectiveMismatch, match="same part of its tensor"):
        ringzero.all_reduce(reg[rank * 16:rank * 16 + count])
    # The group still works, registered or not.
    x = reg[:count]
    x.fill_(rank + 1)
    ringzero.all_reduce(x)
    assert torch.equal(x, torch.full((count,), float(sum(range(1, world + 1)))))
    y = torch.full((count,), float(rank))
    ringzero.all_reduce(y)
    assert torch.equal(y, torch.full((count,), float(sum(range(world)))))
    return True


def test_mismatched_registration_raises_on_every_rank():
    assert run_ranks(2, _mismatch_cases, timeout_s=120) == [True, True]


def _mismatch_on_one_core(rank, world, rounds):
    """Both ranks on one cpu: the rank that finds the other offset first throws and starts its next call
    while its peer, descheduled, has still to compare the offsets (where one field held them, the peer read
    the new offset, ran the registered all-reduce alone and the group timed out: a CI run; this test failed
    3 runs of 3 on that code)."""
    import os
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    count = (1 << 20) // 4
    reg = ringzero.empty(count * 2, dtype=torch.float32)
    for i in range(rounds):
        with pytest.raises(ringzero.CollectiveMismatch, match="same part of its tensor"):
            ringzero.all_reduce(reg[rank * 16:rank * 16 + count])
        x = reg[:count]
        x.fill_(rank + i)
        ringzero.all_reduce(x)
        assert torch.equal(x, torch.full((count,), float(2 * i + 1))), i
    return rounds


def test_mismatched_offsets_raise_on_every_rank_when_one_rank_runs_ahead():
    assert run_ranks(2, _mismatch_on_one_core, 12, env={"RINGZERO_TIMEOUT_S": "30"}, timeout_s=300) == [12, 12]


def _other_group_cases(rank, world):
    sub = dist.new_group([0, 1])
    x = ringzero.empty(1 << 18, dtype=torch.float32)  # the default group's
    if rank < 2:
        with pytest.raises(ValueError, match="allocated by ringzero.empty for another group"):
            ringzero.all_reduce(x, group=sub)
        y = ringzero.empty(1 << 18, dtype=torch.float32, group=sub)
        y.fill_(rank)
        ringzero.all_reduce(y, group=sub)
        assert torch.equal(y, torch.ones(1 << 18))
    x.fill_(1)
    ringzero.all_reduce(x)
    assert torch.equal(x, torch.full((1 << 18,), float(world)))
    return ringzero.is_registered(x) and not ringzero.is_registered(torch.ones(3))


def test_a_tensor_of_another_group_is_a_value_error():
    assert run_ranks(3, _other_group_cases, timeout_s=120) == [True] * 3


def _backend_cases(rank, world):
    rz = dist.new_group(backend="ringzero")
    count = (1 << 20) // 4 + 1
    x = ringzero.empty(count * world, dtype=torch.int64)  # the default (gloo) group's: the same processes
    x.copy_(values(rank, count * world, torch.int64))
    dist.all_reduce(x, group=rz)
    assert torch.equal(x, reduced(world, count * world, torch.int64, "sum"))
    x.copy_(values(rank, count * world, torch.int64))
    out = torch.empty(count, dtype=torch.int64)
    dist.reduce_scatter_tensor(out, x, group=rz)
    assert torch.equal(out, reduced(world, count * world, torch.int64, "sum")[rank * count:(rank + 1) * count])
    gathered = torch.empty(count * world * world, dtype=torch.int64)
    dist.all_gather_into_tensor(gathered, x, group=rz)
    assert torch.equal(gathered, torch.cat([values(q, count * world, torch.int64) for q in range(world)]))
    # The backend reads registered tensors too: a plain one against them is a mismatch there as well.
    t = torch.ones(count * world, dtype=torch.int64) if rank == 0 else x
    with pytest.raises(Exception, match="all_reduce_registered"):
        dist.all_reduce(t, group=rz)
    return ringzero.backend_stats(rz)["native"].get("allreduce", 0) >= 1


def test_the_backend_door_reads_registered_tensors():
    assert run_ranks(2, _backend_cases, timeout_s=120) == [True, True]


def _alone_and_bad(rank, world):
    x = ringzero.empty(4, 5, dtype=torch.float64)
    assert x.shape == (4, 5) and x.dtype == torch.float64
    registered = ringzero.is_registered(x)
    for bad, exc, pattern in (((-1,), TypeError, "non-negative ints"), ((2.5,), TypeError, "non-negative ints")):
        with pytest.raises(exc, match=pattern):
            ringzero.empty(*bad)
    with pytest.raises(TypeError, match="complex64"):
        ringzero.empty(3, dtype=torch.complex64)
    z = ringzero.empty(0, dtype=torch.int32)
    assert z.numel() == 0
    if world > 1:
        with pytest.raises(ringzero.CommError, match="df -h /dev/shm"):
            ringzero.empty(1 << 44, dtype=torch.uint8)  # 16 TiB per rank: more than any /dev/shm here
        y = ringzero.empty(1 << 16)  # the group still allocates and reduces
        y.fill_(1)
        ringzero.all_reduce(y)
        assert torch.equal(y, torch.full((1 << 16,), float(world)))
    return registered


@pytest.mark.parametrize("world", [1, 2])
def test_one_rank_gets_a_plain_tensor_and_bad_calls_raise(world):
    assert run_ranks(world, _alone_and_bad, timeout_s=120) == [world > 1] * world


def _training_buffers(rank, world, register):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.Linear(256, 64))  # 49.7K params: 194 KiB
    ddp = ringzero.DistributedDataParallel(model)
    comm = get_communicator(dist.group.WORLD)
    seq = comm.shm.seq
    ddp(torch.randn(8, 128, generator=torch.Generator().manual_seed(rank))).sum().backward()
    ddp_kinds = kinds_since(comm, seq)
    zero_model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.Linear(512, 128))
    zero = ringzero.ZeroDataParallel(zero_model, stage=3)
    seq = comm.shm.seq
    zero(torch.randn(8, 128)).sum().backward()
    zero_kinds = kinds_since(comm, seq)
    return ([ringzero.is_registered(f) for f in ddp.flats], "all_reduce_registered" in ddp_kinds,
            all(ringzero.is_registered(g.master.detach()) for g in zero.groups), "all_gather_registered" in zero_kinds)


@pytest.mark.parametrize("register", [True, False])
def test_ddp_buckets_and_zero_masters_are_registered_by_default(register):
    """DDP's CPU gradient buckets and ZeRO's float32 master shards come from ringzero.empty (the parity
    tests of tests/parallel check their results), and their collectives take the direct path; with
    RINGZERO_REGISTER_BUFFERS=0 they are plain tensors, staged."""
    env = {} if register else {"RINGZERO_REGISTER_BUFFERS": "0"}
    got = run_ranks(2, _training_buffers, register, env=env, timeout_s=120)
    flats, ddp_direct, masters, zero_direct = got[0]
    assert got[1] == got[0]
    assert flats and all(f == register for f in flats), flats
    assert (ddp_direct, masters, zero_direct) == (register, register, register), got[0]
