"""N processes on one GPU through CUDA IPC, one of which stops taking part: run by
tests/cuda/test_cuda_timeout.py in a fresh interpreter (python tests/helpers/run_cuda_ipc_timeout.py N MODE).
  MODE absent: for each algorithm (one group each), the last rank skips one all-reduce (alive,
               waiting at a gloo barrier);
  MODE dead:   the last rank exits (os._exit) instead of calling a ring all-reduce.
The other ranks must raise ringzero.CommTimeout naming the missing rank within about RINGZERO_TIMEOUT_S
(RINGZERO_CUDA_BLOCKING_WAIT=1: the blocking call waits for its kernel on the host), and their process
must stay usable: CUDA work afterwards succeeds, and a later call on the group refuses at once with the
same CommTimeout. Prints 'ok N ranks'."""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
from harness import run_ranks  # noqa: E402

TIMEOUT_S = 4


def one_missing(rank, world, mode):
    """One group, a warm-up all-reduce on every rank, then one the last rank does not call."""
    import ringzero

    missing = world - 1
    # A short gloo timeout for the group: its teardown meets the ranks (CudaPath.close), a dead one never.
    group = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=20))
    x = torch.ones(50_000, device="cuda")
    ringzero.all_reduce(x, group=group)  # every rank: the CUDA path and its IPC handles are set up
    torch.cuda.synchronize()
    assert torch.equal(x.cpu(), torch.full((50_000,), float(world))), "warm-up all-reduce"
    if rank == missing:
        if mode == "dead":
            os._exit(0)
        dist.barrier()  # alive but never calls the all-reduce; the others come here after their timeout
        return "absent"
    t0 = time.monotonic()
    try:
        ringzero.all_reduce(x, group=group)
        raise AssertionError(f"rank {rank}: the all-reduce with rank {missing} missing returned without an error")
    except ringzero.CommTimeout as e:
        took = time.monotonic() - t0
        message = str(e)
    assert f"group rank {missing} never arrived" in message, message
    assert took < 3 * TIMEOUT_S + 10, f"rank {rank}: CommTimeout after {took:.1f} s (timeout {TIMEOUT_S} s)"
    # The process and its CUDA context are fine: new work runs and is right.
    y = torch.arange(1000, device="cuda", dtype=torch.float32) * 2
    torch.cuda.synchronize()
    assert y.sum().item() == 999_000.0
    # The group's CUDA communicator refuses further calls, naming the same cause, without a kernel.
    t1 = time.monotonic()
    try:
        ringzero.all_reduce(torch.ones(8, device="cuda"), group=group)
        raise AssertionError("a call after the timeout was accepted")
    except ringzero.CommTimeout as e:
        assert f"group rank {missing} never arrived" in str(e), str(e)
    assert time.monotonic() - t1 < 5
    if mode == "absent":
        dist.barrier()
    return f"raised after {took:.1f} s"


def body(rank, world, mode):
    torch.cuda.set_device(0)
    results = []
    for algo in (["oneshot", "twoshot", "ring"] if mode == "absent" else ["ring"]):
        os.environ["RINGZERO_ALLREDUCE_ALGO"] = algo  # read when the group's communicator is made
        results.append(f"{algo}: {one_missing(rank, world, mode)}")
    return results


if __name__ == "__main__":
    world, mode = int(sys.argv[1]), sys.argv[2]
    env = {"RINGZERO_TIMEOUT_S": str(TIMEOUT_S), "RINGZERO_CUDA_BLOCKING_WAIT": "1",
           "RINGZERO_CUDA_BUFFER_BYTES": str(256 << 10), "RINGZERO_CUDA_RING_CHANNELS": "2",
           "RINGZERO_CUDA_MAX_BLOCKS": "4"}
    results = run_ranks(world, body, mode, env=env, timeout_s=150,
                        expect_exit={world - 1: True} if mode == "dead" else None)
    print(f"ok {world} ranks: {results}")
