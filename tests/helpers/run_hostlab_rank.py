"""What each rank runs under torchrun inside the host lab (tests/helpers/hostlab.py), by mode; each rank writes its
findings to <out>/rank<global rank>.json for tests/lab/test_hostlab.py to judge.

  collectives: every collective against gloo (tests/helpers/collective_cases.py), send/recv through a ringzero
               backend group, and the layout the communicator found (its topology and shared memory)
               beside what the ranks see of their hosts (hostname, /dev/shm device).
  backend:     the swap-in backend across the hosts: the op-by-op suite of tests/helpers/backend_cases.py on a
               dist.new_group(backend="ringzero") against the default gloo group, then stock DDP and FSDP2
               on it against the same training on gloo (tests/helpers/run_backend_train.py).
  fault:       all-reduces of --mib MiB in a loop until one fails (the test cuts a host's link meanwhile);
               records the exception, its message and when it came. --backend: dist.all_reduce on a
               ringzero backend group instead of ringzero.all_reduce.
"""
import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ringzero  # noqa: E402
import backend_cases  # noqa: E402
from run_backend_train import train_ddp, train_fsdp2  # noqa: E402
from collective_cases import check_all, random_floats_and_async  # noqa: E402
from reference import check_equal, make  # noqa: E402

LAB_SIZES = [0, 13, 5003]
"""Fewer sizes than the one-host tests (CI time): empty, odd, and larger than the 4 KiB slot and 1 KiB slice."""


def layout(comm) -> dict:
    """What the communicator found, next to what this process sees of its host."""
    shm = comm.shm
    return {"hostname": socket.gethostname(), "shm_device": os.stat("/dev/shm").st_dev,
            "hosts": [list(r) for r in comm.hosts.values()], "local_ranks": list(comm.local_ranks),
            "hierarchical": comm.hierarchical, "shm_nranks": shm.nranks if shm else 0,
            "shm_seq": shm.seq if shm else 0}


def send_recv(rank: int, world: int) -> int:
    """Every rank sends to the rank `shift` ahead and receives from the one `shift` behind, int64 and
    bfloat16, through a ringzero backend group spanning the hosts (known inputs are the reference)."""
    group = dist.new_group(list(range(world)), backend="ringzero")
    cases = 0
    for shift in range(1, world):
        dst, src = (rank + shift) % world, (rank - shift) % world
        for dtype in (torch.int64, torch.bfloat16):
            for n in (1, 5003):
                got = torch.zeros(n, dtype=dtype)
                ops = [dist.P2POp(dist.isend, make(rank, n, dtype, salt=shift), dst, group),
                       dist.P2POp(dist.irecv, got, src, group)]
                for w in dist.batch_isend_irecv(ops):
                    w.wait()
                check_equal(got, make(src, n, dtype, salt=shift), f"send/recv {dtype} n={n} from {src}")
                cases += 1
    dist.destroy_process_group(group)
    return cases


def collectives(rank: int, world: int) -> dict:
    comm = ringzero.get_communicator(dist.group.WORLD)
    mode = "hierarchical" if comm.hierarchical else "flat ring"
    cases = check_all(rank, world, None, mode, sizes=LAB_SIZES)
    random_floats_and_async(rank, world, None, mode)
    cases += send_recv(rank, world)
    return {"mode": mode, "cases": cases, **layout(comm)}


def backend(rank: int, world: int) -> dict:
    calls, kind = backend_cases.body(rank, world, spans_hosts=True, sizes=LAB_SIZES)
    g = dist.new_group(backend="ringzero")
    training = {}
    for name, train in [("ddp", train_ddp), ("fsdp2", train_fsdp2)]:
        ref, ours = train(dist.group.WORLD), train(g)  # gloo, then the swap-in
        training[name] = {"max_diff": (ours - ref).abs().max().item(), "equal": torch.equal(ours, ref)}
    stats = ringzero.backend_stats(g)
    return {"mode": kind, "cases": calls, "training": training, "stats": stats}


def fault(rank: int, world: int, out: str, mib: float, on_backend: bool = False) -> dict:
    x = torch.ones(int(mib * (1 << 20)) // 4)
    if on_backend:
        g = dist.new_group(backend="ringzero")
        all_reduce = lambda t: dist.all_reduce(t, group=g)  # noqa: E731
    else:
        all_reduce = ringzero.all_reduce
    all_reduce(x)  # the communicator is set up before the link goes
    open(os.path.join(out, f"ready{rank}"), "w").close()
    calls, start = 0, time.time()
    try:
        while time.time() - start < 600:
            all_reduce(x)
            calls += 1
    except Exception as e:  # what the test judges: the type, the message, the time
        return {"error": type(e).__name__, "message": str(e), "t_error": time.time(), "calls": calls}
    return {"error": None, "calls": calls}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["collectives", "backend", "fault"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--mib", type=float, default=1, help="fault: the all-reduce's size")
    parser.add_argument("--backend", action="store_true", help="fault: on a ringzero backend group")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.mode == "collectives":
        result = collectives(rank, world)
    elif args.mode == "backend":
        result = backend(rank, world)
    else:
        result = fault(rank, world, args.out, args.mib, args.backend)
    result["rank"] = rank
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    if args.mode == "fault":
        os._exit(0)  # the group is broken: no destroy_process_group (it would wait on the lost peers)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
