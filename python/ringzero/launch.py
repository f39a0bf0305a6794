"""Starting ranks for the command-line tools: under torchrun (RANK and WORLD_SIZE set) the current
process is one rank; otherwise `--nproc N` spawns N local ranks with a gloo process group."""
from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, nproc: int, port: int, fn, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(nproc),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc))
    _run(fn, args, nproc)


def _run(fn, args, local_world: int):
    # Each rank gets its share of the cores for its own compute (torch intra-op threads).
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local_world)))
    dist.init_process_group("gloo")
    try:
        fn(*args)
    finally:
        import ringzero

        ringzero.destroy_communicators()
        dist.destroy_process_group()


def launch(fn, nproc: int, *args):
    """Runs fn(*args) on every rank. fn must be a module-level function (it is pickled for spawn)."""
    if under_torchrun():
        _run(fn, args, int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])))
        return
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"--nproc must be a positive int, got {nproc!r}")
    mp.start_processes(_worker, args=(nproc, _free_port(), fn, args), nprocs=nproc, join=True, start_method="spawn")
