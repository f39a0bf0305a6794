"""The CUDA path of a Communicator: CUDA tensors go through ringzero's own kernels.

  - ranks on one host: peer-memory collectives over CUDA IPC (csrc/cuda: one-shot, two-shot and ring
    all-reduce; ring reduce-scatter and all-gather), each rank's staging buffer and flags exchanged as
    IPC handles through the group's store (comm/host_group.py: a rank that never arrives gives
    CommTimeout naming it);
  - several hosts: the ring driver over NCCL send/recv with our reduction kernel between steps
    (csrc/nccl), hierarchical when every host has the same number of ranks (IPC reduce-scatter in the
    host, NCCL ring across hosts, IPC all-gather), flat otherwise.
Every op of a communicator runs on one side stream that waits for the caller's current stream; a
blocking call makes the current stream wait for it (no host synchronisation, so it can be captured in
a CUDA graph), and async_op=True returns a CudaWork whose wait() does that later, as torch's NCCL
backend does. Broadcast, reduce and all_gather_v on CUDA tensors take the CPU path through a host copy.

Timeouts ([Note: a wait that runs out] in csrc/cuda/device.cuh): a kernel whose wait for a peer runs
past RINGZERO_TIMEOUT_S records who it waited for in host-mapped memory and returns (no trap: the CUDA
context stays usable). The host raises ringzero.CommTimeout naming the rank that never arrived:
  - with RINGZERO_CUDA_BLOCKING_WAIT=1, at the end of the blocking call (or in wait()), which then
    waits for the kernel on the host (as TORCH_NCCL_BLOCKING_WAIT does; never during graph capture);
  - otherwise at this group's next CUDA collective, wait(), is_completed() or exception(), without
    a host wait. Until then the output of the timed-out call holds partial values.
A communicator whose kernel timed out refuses every later call (its flags no longer agree).

Ran on a GPU once, an H100 before the issue-15 fix (docs/cuda.md); the timeout path and the fuzz
have been compiled only, not run on a GPU yet.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .. import _C
from .config import from_env
from .errors import CommError, CommTimeout
from .exchange import checked_count_matrix
from .hierarchical import all_reduce_hierarchical
from .transports import HIERARCHICAL, ONE_HOST, RING, SOLO, Solo, layout
from .types import ReduceOp

CUDA_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64)
# The `coll` codes of the peer collectives (cuda::Coll), from _C; None in a build without CUDA.
ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER = (_C.CUDA_COLLS.get(k) for k in ("all_reduce", "reduce_scatter", "all_gather"))


def peer_config(timeout_s: float | None = None) -> dict:
    """Keyword arguments of _C.CudaPeerComm/_C.CudaSimWorld from the RINGZERO_CUDA_* variables
    (comm/config.py); timeout_s overrides RINGZERO_TIMEOUT_S."""
    return from_env().peer_config(timeout_s)


def check_available(op: str, arg: str):
    if not getattr(_C, "has_cuda", False):
        raise ValueError(
            f"ringzero.{op}: {arg} is a CUDA tensor, but this build of ringzero has no CUDA path (it was built "
            "against a CPU torch or without nvcc); rebuild with a CUDA torch and nvcc, or pass a CPU tensor"
        )


def simulated_world(nranks: int, **overrides):
    """N simulated ranks on the current GPU (docs/design.md "Proving GPU code on one GPU"): returns a
    _C.CudaSimWorld whose run(coll, inputs, outputs, op, algo) takes one tensor per rank."""
    if not torch.cuda.is_available():
        raise RuntimeError("ringzero: simulated ranks run on a GPU, and this process sees none "
                           "(torch.cuda.is_available() is False: no device, or no NVIDIA driver)")
    cfg = peer_config()
    cfg.update(overrides)
    return _C.CudaSimWorld(nranks, **cfg)


def blocking_wait() -> bool:
    """RINGZERO_CUDA_BLOCKING_WAIT=1: blocking calls and wait() wait for the kernel on the host and raise
    CommTimeout at once (see the module docstring)."""
    return from_env().cuda_blocking_wait


class CudaWork:
    """An async CUDA collective: wait() makes the caller's current stream wait for it (no host wait
    unless RINGZERO_CUDA_BLOCKING_WAIT=1), raising CommTimeout if a kernel of the group timed out."""

    def __init__(self, event: torch.cuda.Event, device: torch.device, result=None, path=None, what: str = ""):
        self._event = event
        self._device = device
        self._result = result
        self._path = path
        self._what = what

    def wait(self, timeout: float | None = None) -> bool:
        torch.cuda.current_stream(self._device).wait_event(self._event)
        if self._path is not None:
            if blocking_wait():
                self._event.synchronize()
            self._path.check(self._what)
        return True

    def is_completed(self) -> bool:
        done = self._event.query()
        if done and self._path is not None:
            self._path.check(self._what)
        return done

    def is_success(self) -> bool:
        return self._event.query() and self.exception() is None

    def exception(self):
        try:
            if self._path is not None and self._event.query():
                self._path.check(self._what)
        except CommTimeout as e:
            return e
        return None

    def result(self):
        self.wait()
        return self._result

    def get_future(self) -> torch.futures.Future:
        """A future completed once the collective finished (this waits on the host)."""
        self._event.synchronize()
        fut = torch.futures.Future()
        fut.set_result(self._result)
        return fut


def open_ipc_peers(rendezvous, topology, device: torch.device, peer_cfg: dict):
    """The CUDA IPC step of a CUDA setup, shared by the Communicator's CUDA path and the c10d backend's
    CUDA lane (comm/backend.py): this rank's _C.CudaPeerComm on `device` (None when it is alone on its
    host) with the staging buffers of the other ranks of its host opened, after one exchange of IPC
    handles among all ranks of the group through `rendezvous` (a missing rank: CommTimeout naming it).
    Every rank of the group calls it at the same point. Returns (peer, error, errors, gpus): this rank's
    own failure or None, the failures every rank reported at the exchange, and each rank's GPU as
    (host, uuid). The caller ends the setup with finish_setup()."""
    rank, peer, error, gpu = rendezvous.rank, None, None, None
    try:
        with torch.cuda.device(device):
            gpu = (topology.host, str(torch.cuda.get_device_properties(device).uuid))
            if topology.local_world > 1:
                peer = _C.CudaPeerComm(topology.local_rank, topology.local_world, **peer_cfg)
    except Exception as e:  # reported to every rank by finish_setup
        error = f"rank {rank}: {e}"
    handles = rendezvous.all_gather_object("cuda/ipc", (peer.ipc_handle() if peer else None, error, gpu),
                                           list(range(topology.world)))
    errors = [e for _, e, _ in handles if e]
    if not errors and peer is not None:
        try:
            peer.open_peers([handles[r][0] for r in topology.local_ranks])
        except Exception as e:
            error = f"rank {rank}: {e}"
    return peer, error, errors, [g for _, _, g in handles]


def finish_setup(rendezvous, world: int, error, errors):
    """The last exchange of a CUDA setup among the `world` ranks of the group: every rank reports its own
    failure (or None); if any rank failed, every rank raises CommError naming them all."""
    opened = rendezvous.all_gather_object("cuda/opened", error, list(range(world)))
    errors = list(errors) + [e for e in opened if e]
    if errors:
        raise CommError("ringzero could not set up the CUDA path: " + "; ".join(sorted(set(errors))))


def nccl_rings(rendezvous, topology, world: int, kind: str, device: torch.device, slice_bytes: int):
    """NCCL rings across hosts for a group of layout `kind` (HIERARCHICAL or RING): the flat ring over the
    whole group, and when hierarchical one more ring per local rank across hosts. Each ring's first member
    makes its unique id; the ids travel through `rendezvous` (every rank of the group calls this at the same
    point). Returns (flat, cross or None, error string or None). The Communicator's CUDA path and the c10d
    backend's CUDA lane across hosts (comm/backend.py) both set up here."""
    rank = rendezvous.rank
    if not getattr(_C, "has_nccl", False):
        return None, None, f"rank {rank}: this build has no NCCL (the nvidia-nccl-cu13 wheel was not found at build time)"

    def ring(key: str, members: list[int], all_rings: list[list[int]] | None = None):
        leaders = {m[0] for m in (all_rings or [members])}
        ids = rendezvous.all_gather_object(key, _C.nccl_unique_id() if rank in leaders else None, list(range(world)))
        with torch.cuda.device(device):
            return _C.NcclRing(ids[members[0]], members.index(rank), len(members), slice_bytes)

    try:
        flat = ring("cuda/nccl/flat", list(range(world)))
        cross = ring("cuda/nccl/cross", topology.cross_ring, topology.cross_rings) if kind == HIERARCHICAL else None
    except Exception as e:
        return None, None, f"rank {rank}: NCCL ring setup failed: {e}"
    return flat, cross, None


def cuda_transport(kind: str, host, peer, flat, cross, algo: int, local_world: int, world: int):
    """The CUDA transport of a group of layout `kind` (transports.layout, the one decision for every door):
    `host` is the group's CPU transport (broadcast, reduce and all_gather_v run through host copies on it;
    None where the caller never asks for those), `peer` the IPC communicator of this rank's host, `flat` and
    `cross` the NCCL rings of nccl_rings()."""
    if kind == SOLO:
        return Solo()
    if kind == ONE_HOST:
        return CudaPeers(host, peer, algo)
    if kind == HIERARCHICAL:
        return CudaHierarchical(host, flat, peer, cross, local_world, world)
    return CudaRing(host, flat)


class CudaPath:
    """The CUDA side of one Communicator, made on its first CUDA collective (every rank of the group
    must make it at the same call, as with any collective): the setup, the stream, the timeout checks,
    and `transport`, the CUDA transport of the group's layout, picked once here."""

    def __init__(self, comm, device: torch.device):
        self.comm = comm
        self.device = device
        self.stream = torch.cuda.Stream(device)  # the one stream all of this communicator's ops use
        cfg = comm.host_group.config.peer_config(comm.timeout_s)
        self.peer = None
        self.flat = None
        self.cross = None
        slice_bytes = comm.ring_slice_bytes
        # Every exchange below goes through the group's store with the timeout: a rank that never gets
        # here makes the others raise CommTimeout naming it.
        self._rendezvous = comm.host_group.rendezvous.relabelled(
            "ringzero: setting up the CUDA path (the first CUDA collective on this group)")
        self.peer, error, errors, _ = open_ipc_peers(self._rendezvous, comm.host_group.topology, device, cfg)
        self.layout = layout(comm.host_group.topology, comm.world)
        if self.layout in (HIERARCHICAL, RING) and not errors:  # every rank takes part: the others wait for its ids
            self.flat, self.cross, nccl_error = nccl_rings(self._rendezvous, comm.host_group.topology, comm.world,
                                                           self.layout, device, slice_bytes)
            error = error or nccl_error
        finish_setup(self._rendezvous, comm.world, error, errors)
        self.transport = cuda_transport(self.layout, comm.transport, self.peer, self.flat, self.cross, comm.algo,
                                        comm.local_world, comm.world)

    def close(self):
        """Frees the staging buffers once every rank is done: a peer's last ring step may still write
        a flag into ours, so all ranks finish their GPU work and meet first (skipped if the group is
        already gone; then only this rank's own work is awaited)."""
        torch.cuda.synchronize(self.device)
        try:
            dist.barrier(group=self.comm.group)
        except Exception:  # the process group was destroyed first: nothing left to meet with
            pass
        self.peer = self.flat = self.cross = self.transport = None

    def check_device(self, t: torch.Tensor, op: str):
        if t.device != self.device:
            raise ValueError(f"ringzero.{op}: tensor is on {t.device} but this group's CUDA collectives run on "
                             f"{self.device} (the device of its first CUDA collective); use one device per rank")

    # ---- timeouts ------------------------------------------------------------------------------------
    def check(self, what: str = "a CUDA collective"):
        """Raises CommTimeout if a kernel of this group's IPC communicator ran out of time waiting for a
        peer, naming (in group ranks) the rank that waited and the one that never arrived. Reads host
        memory only: no CUDA call, no wait."""
        rec = self.peer.timeout_record() if self.peer is not None else None
        if rec is None:
            return
        g = self.comm.local_ranks  # communicator rank -> group rank
        chain = "" if rec["culprit"] == rec["peer"] else \
            f" (which was waiting itself; first rank along the chain of waits: {g[rec['culprit']]})"
        raise CommTimeout(
            f"ringzero {what}: a CUDA kernel of group rank {g[rec['rank']]} waited more than "
            f"{self.comm.timeout_s:g} s (RINGZERO_TIMEOUT_S) for {rec['what']} of group rank {g[rec['peer']]}{chain}: "
            f"group rank {g[rec['culprit']]} never arrived (it died, hangs, or called a different collective). "
            "The kernel returned early, so the output holds partial values; this group's CUDA communicator is "
            "unusable now (every later call raises this), the process and its CUDA context are fine."
        )

    # ---- streams -------------------------------------------------------------------------------------
    def launch(self, fn, async_op: bool, tensors, result, what: str = "a CUDA collective"):
        """Runs fn on self.stream after the current stream's work; see the module docstring."""
        self.check(what)  # an earlier call timed out: refuse, naming the cause
        cur = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(cur)
        with torch.cuda.stream(self.stream):
            fn()
        done = torch.cuda.Event()
        done.record(self.stream)
        if not async_op:
            cur.wait_event(done)
            if blocking_wait() and not torch.cuda.is_current_stream_capturing():
                done.synchronize()  # ends within the timeout: every kernel wait is bounded
                self.check(what)
            return None
        for t in tensors:  # the caching allocator must not hand their memory out before we finish
            t.record_stream(self.stream)
        return CudaWork(done, self.device, result, self, what)


# ---- the CUDA transports: the calls of comm/transports.py on CUDA tensors, run on CudaPath's stream -------
def _through_host(fn, out: torch.Tensor, *inputs: torch.Tensor):
    """Runs fn on host copies of the tensors and copies `out` back (this waits for the GPU; it is
    correct, not fast)."""
    host = out.cpu()
    fn(host, *(t.cpu() for t in inputs))
    out.copy_(host)


class _CudaTransport:
    """What the CUDA transports share: broadcast, reduce and all_gather_v have no CUDA kernels (nor has the
    all-to-all across hosts), so they run on host copies through the group's CPU transport (`host`)."""

    def __init__(self, host):
        self.host = host

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, counts: list[int] | None = None):
        if counts is None:
            self.all_gather_even(out, inp)
        else:
            _through_host(lambda o, i: self.host.all_gather(o, i, counts), out, inp)

    def broadcast(self, x: torch.Tensor, root: int):
        _through_host(lambda h: self.host.broadcast(h, root), x)

    def reduce(self, x: torch.Tensor, root: int, op: ReduceOp):
        _through_host(lambda h: self.host.reduce(h, root, op), x)

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, send_counts: list[int], recv_counts: list[int]):
        _through_host(lambda o, i: self.host.all_to_all(o, i, send_counts, recv_counts), out, inp)


class CudaPeers(_CudaTransport):
    """Every rank on one host: the peer-memory kernels over CUDA IPC (csrc/cuda)."""

    def __init__(self, host, peer, algo: int):
        super().__init__(host)
        self.peer, self.algo = peer, algo

    def all_reduce(self, x: torch.Tensor, op: ReduceOp):
        self.peer.run(ALL_REDUCE, x, x, int(op), self.algo)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp):
        self.peer.run(REDUCE_SCATTER, inp, out, int(op), 0)

    def all_gather_even(self, out: torch.Tensor, inp: torch.Tensor):
        self.peer.run(ALL_GATHER, inp, out, int(ReduceOp.SUM), 0)

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, send_counts: list[int], recv_counts: list[int]):
        """The all-to-all kernel over CUDA IPC (csrc/cuda/alltoall.cu). The kernel places each block by its
        sender's count and has no way to report a disagreement, so the counts meet first on the host (one
        small all-gather through shared memory): ranks whose split sizes disagree all raise
        CollectiveMismatch, naming the pair, before any kernel runs. The send counts then go to the device
        on the current (the communicator's) stream, where the kernel reads them."""
        checked_count_matrix(lambda mine, table: self.host.all_gather(table, mine), len(send_counts),
                             "all_to_all", send_counts, recv_counts, self.host.shm.rank)
        counts = torch.tensor(send_counts, dtype=torch.int64).to(inp.device, non_blocking=True)
        self.peer.all_to_all(inp, out, counts)


class CudaRing(_CudaTransport):
    """Several hosts: the ring driver over NCCL across the whole group (csrc/nccl)."""

    def __init__(self, host, flat):
        super().__init__(host)
        self.flat = flat

    def all_reduce(self, x: torch.Tensor, op: ReduceOp):
        self.flat.all_reduce(x, int(op))

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp):
        # The flat ring also when hierarchical: the blocks are in group-rank order.
        self.flat.reduce_scatter(inp, torch.empty_like(inp), out, int(op))

    def all_gather_even(self, out: torch.Tensor, inp: torch.Tensor):
        self.flat.all_gather(inp, out)


class CudaHierarchical(CudaRing):
    """Several hosts with the same number (> 1) of ranks each: all-reduce as IPC reduce-scatter, an NCCL
    ring per local rank across hosts (`cross`), IPC all-gather; the other collectives take the flat ring."""

    def __init__(self, host, flat, peer, cross, local_world: int, world: int):
        super().__init__(host, flat)
        self.peer, self.cross, self.local_world, self.world = peer, cross, local_world, world

    def all_reduce(self, x: torch.Tensor, op: ReduceOp):
        base = ReduceOp.SUM if op == ReduceOp.AVG else op
        all_reduce_hierarchical(x, self.local_world,
                                lambda staged, part: self.peer.run(REDUCE_SCATTER, staged, part, int(base), 0),
                                lambda part: self.cross.all_reduce(part, int(base)),
                                lambda part, gathered: self.peer.run(ALL_GATHER, part, gathered, int(base), 0))
        if op == ReduceOp.AVG:  # [Note: AVG in the hierarchical all-reduce] (comm/hierarchical.py)
            if x.dtype.is_floating_point:
                x.div_(self.world)
            else:
                x.copy_(torch.div(x, self.world, rounding_mode="trunc"))
