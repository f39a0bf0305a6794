"""Starting ranks for the command-line tools: under torchrun (RANK and WORLD_SIZE set) the current
process is one rank; otherwise `--nproc N` starts N local ranks (forked from a fork server on the CPU,
[Note: the fork server] below; spawned for CUDA). The process group is gloo on CPU; with
device="cuda" each rank first selects its GPU and the backend follows trainer/device.py's rule."""
from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..comm.affinity import bind_process, core_share
from ..heap import keep_freed_memory


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, nproc: int, port: int, fn, args, device: str, parent=None):
    if parent is not None:  # forked from the fork server: take the launching process's environment and output
        environ, stdio = parent
        os.environ.clear()
        os.environ.update(environ)
        for target, fd in zip((1, 2), stdio):
            if fd is not None and fd != target:
                os.dup2(fd, target)
                os.close(fd)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(nproc),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc))
    _run(fn, args, nproc, device)


def _init_process_group(backend: str = "gloo"):
    """env:// rendezvous, with the keys of each torchrun round under their own prefix: after a restart
    the store still holds the dead round's gloo addresses, and connecting to them fails."""
    if "TORCHELASTIC_RESTART_COUNT" not in os.environ:
        dist.init_process_group(backend)
        return
    import datetime

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                          timeout=datetime.timedelta(seconds=ROUND_TIMEOUT_S))
    dist.init_process_group(backend, store=dist.PrefixStore(_round_prefix(store, rank, world), store), rank=rank,
                            world_size=world)


ROUND_TIMEOUT_S = 300
_ROUND_KEY = "ringzero/launch/round"


def _round_prefix(store, rank: int, world: int) -> str:
    """A store prefix that every rank of this torchrun round shares and no other round has.

    TORCHELASTIC_RESTART_COUNT is not it across hosts: the agent whose rank failed counts a restart, the
    other hosts' agents restart on the membership change without counting. So each process publishes a
    fresh nonce; rank 0 waits until every rank's nonce differs from the ones recorded for the previous
    round, then records this round (number + nonces); the others wait for a record holding their nonce.
    """
    import json
    import time
    import uuid

    nonce = uuid.uuid4().hex
    store.set(f"ringzero/launch/nonce/{rank}", nonce)
    deadline = time.monotonic() + ROUND_TIMEOUT_S

    def record():
        return json.loads(store.get(_ROUND_KEY)) if store.check([_ROUND_KEY]) else {"round": -1, "nonces": []}

    if rank == 0:
        last = record()
        old = last["nonces"] if len(last["nonces"]) == world else [None] * world
        while True:
            keys = [f"ringzero/launch/nonce/{r}" for r in range(world)]
            now = [store.get(k).decode() if store.check([k]) else None for k in keys]
            stale = [r for r in range(world) if now[r] is None or now[r] == old[r]]
            if not stale:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"ringzero launch: ranks {stale} did not start this torchrun round within "
                                   f"{ROUND_TIMEOUT_S} s")
            time.sleep(0.05)
        this_round = last["round"] + 1
        store.set(_ROUND_KEY, json.dumps({"round": this_round, "nonces": now}))
    else:
        while True:
            current = record()
            if len(current["nonces"]) == world and current["nonces"][rank] == nonce:
                this_round = current["round"]
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"ringzero launch: rank 0 did not open this torchrun round within "
                                   f"{ROUND_TIMEOUT_S} s")
            time.sleep(0.05)
    return f"ringzero/round-{this_round}"


def _bind(local_world: int) -> int:
    """Binds this rank to its core_share (unless RINGZERO_BIND_CORES=0) and returns how many cpus it has
    for its own compute. [Note: where the host runs the ranks' cores] in csrc/core/shm_placement.cpp."""
    from ..comm.config import from_env

    allowed = os.sched_getaffinity(0)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    mine = core_share(allowed, local_rank, local_world) if from_env().bind_cores else None
    if mine is None:
        return max(1, len(allowed) // max(1, local_world))
    # Every thread, not only this one: `import torch` has already started numpy's OpenBLAS server thread,
    # which os.sched_setaffinity(0, ...) would leave free to run on the peer's core.
    bind_process(mine)
    return len(mine)


def _run(fn, args, local_world: int, device: str = "cpu"):
    keep_freed_memory()  # [Note: a rank keeps its heap] in heap.py
    # Each rank gets its share of the cores for its own compute (torch intra-op threads).
    torch.set_num_threads(_bind(local_world))
    backend = "gloo"
    if device != "cpu":
        from ..trainer.device import bind

        _, backend = bind(device)  # selects this rank's GPU before any CUDA work or NCCL
    _init_process_group(backend)
    try:
        fn(*args)
    finally:
        import ringzero

        ringzero.destroy_communicators()
        dist.destroy_process_group()


def launch(fn, nproc: int, *args, device: str = "cpu"):
    """Runs fn(*args) on every rank. fn must be a module-level function (it is pickled for the ranks).
    device: 'cpu', or 'cuda' (each rank binds its GPU, trainer/device.py, before the process group)."""
    if under_torchrun():
        _run(fn, args, int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])), device)
        return
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"--nproc must be a positive int, got {nproc!r}")
    if device == "cpu":
        parent = (dict(os.environ), _stdio_for_child())
        _prepare_fork_server(fn)
        start_method = "forkserver"
    else:
        parent, start_method = None, "spawn"
    mp.start_processes(_worker, args=(nproc, _free_port(), fn, args, device, parent), nprocs=nproc, join=True,
                       start_method=start_method)


def run_as_user_script(fn, *args):
    """Runs fn(*args) in this torchrun rank as a user's own script would: init_process_group("gloo") from
    torchrun's environment, nothing bound by a launcher (the ranks then bind themselves at setup,
    [Note: binding at setup] in comm/affinity.py), and the process group torn down after. The benchmarks
    that set ringzero against other libraries launch it this way, as most users do."""
    import ringzero

    dist.init_process_group("gloo")
    try:
        return fn(*args)
    finally:
        ringzero.destroy_communicators()
        dist.destroy_process_group()


# [Note: the fork server]
# `--nproc N` starts its ranks from a fork server (multiprocessing's "forkserver"): one process, started at
# the first launch and kept for the launching process's life, that imports torch, ringzero and fn's module
# once; each rank is a fork of it. Spawned ranks paid those imports in every rank of every run, 3-6 s of the
# 2-core machine per `ringzero train` row (torch._dynamo alone, which the first nn.Embedding pulls in,
# 1.5 s; transformers another 4 s for the hf models). What a fork of the server would get wrong, the
# launcher passes at each launch: the environment of the launching process as it is now (the server keeps
# the one it started with) and its stdout and stderr (the server's are those of the first launch; under
# pytest's capture they are another test's). CPU runs only: the server imports torch, and a process that
# forks after anything has touched CUDA hands its children a CUDA they cannot use; CUDA runs spawn.
_SERVER_PRELOAD: list[str] = []  # what the fork server this process started imports ([] before the first launch)


def _prepare_fork_server(fn):
    """The fork server's preloads, read when it starts: fn's module (and with it torch and ringzero),
    torch._dynamo, and the transformers model modules this process has imported (those of an hf model:
    `ringzero train` builds its config before any rank starts). A launch whose process has imported model
    modules the running server lacks restarts it with them (once, when a process first trains an hf model
    after a launch without one; where Python's fork server cannot be stopped, the ranks import them). A
    new fn module alone does not: with torch loaded, a rank imports it quickly."""
    import multiprocessing
    import multiprocessing.forkserver

    hf = {m for m in sys.modules if m.startswith("transformers.models.") and ".modeling_" in m}
    if _SERVER_PRELOAD:
        if hf <= set(_SERVER_PRELOAD):
            return
        stop = getattr(multiprocessing.forkserver._forkserver, "_stop", None)
        if stop is None:
            return
        stop()
    _SERVER_PRELOAD[:] = sorted({"ringzero", fn.__module__, "torch._dynamo", *hf, *_SERVER_PRELOAD})
    multiprocessing.set_forkserver_preload(list(_SERVER_PRELOAD))


class _ParentFd:
    """One of the launching process's file descriptors, for a rank started by the fork server: it is sent
    with the rank's arguments when they are pickled (multiprocessing's DupFd, which only works then) and
    arrives as a descriptor of the rank's own."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        from multiprocessing.reduction import DupFd

        return _detach, (DupFd(self.fd),)


def _detach(dup) -> int:
    return dup.detach()


def _stdio_for_child():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError):
            pass
    return tuple(_ParentFd(fd) if _is_open(fd) else None for fd in (1, 2))


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:  # a launching process without stdout or stderr: the ranks keep the server's
        return False
