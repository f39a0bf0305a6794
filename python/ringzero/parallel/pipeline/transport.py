"""How a PipelineRunner moves activations and their gradients between pipeline ranks.

  gloo  CPU tensors: torch.distributed point-to-point on a gloo group.
  nccl  CUDA tensors when every rank has a GPU of its own: torch.distributed point-to-point on a group
        whose CUDA backend is NCCL (init_process_group("cpu:gloo,cuda:nccl")); GPU to GPU.
  ipc   CUDA tensors when ranks share a GPU (NCCL refuses two ranks on one device) or NCCL is
        missing: the receiver copies straight out of the sender's memory through a CUDA IPC mapping
        (IpcP2P below); only a small header and an acknowledgement travel over the CPU group.

ringzero's C++ layers have no CUDA send/recv of their own (csrc/cuda has collectives only), so the
ipc transport maps memory with torch's CUDA IPC (torch.multiprocessing.reductions), the mechanism
torch.multiprocessing uses to pass CUDA tensors between processes.
"""
from __future__ import annotations

import pickle

import torch
import torch.distributed as dist

TRANSPORTS = ("gloo", "nccl", "ipc")


def choose_transport(device_type: str, gpu_shared: bool, nccl_available: bool) -> str:
    """The transport for pipeline tensors on `device_type` ('cpu' or 'cuda'). gpu_shared: some GPU
    holds more than one rank of the job; nccl_available: torch has NCCL (dist.is_nccl_available()).
    Never a path through host memory for CUDA tensors."""
    if device_type == "cpu":
        return "gloo"
    if device_type != "cuda":
        raise ValueError(f"pipeline transport: device type {device_type!r} is neither 'cpu' nor 'cuda'")
    return "nccl" if nccl_available and not gpu_shared else "ipc"


class TorchP2P:
    """gloo and nccl: torch.distributed's batch_isend_irecv; the group's backend for the tensors'
    device decides which library moves them."""

    name = "torch"

    def post(self, ops, group) -> list:
        """ops: (is_send, tensor, peer global rank, tag) tuples. Returns one work per op, in order."""
        p2p = [dist.P2POp(dist.isend if send else dist.irecv, t, peer, group, tag) for send, t, peer, tag in ops]
        return dist.batch_isend_irecv(p2p) if p2p else []


HEADER_BYTES = 4096
"""A pickled CUDA IPC descriptor (memory handle, offsets, reference-counter and event handles) is
well under 1 KiB; the header is a fixed size so that the receiver can post its receive first."""
ACK_TAG_BASE = 1 << 24
"""Acknowledgements travel on tag + ACK_TAG_BASE, above every tag the runtime uses."""


class _IpcSend:
    """Keeps the sent tensor alive until the receiver says it has copied it (the acknowledgement)."""

    def __init__(self, tensor, header_work, ack_work, header):
        self._tensor, self._works, self._header = tensor, (header_work, ack_work), header

    def wait(self, timeout=None) -> bool:
        for w in self._works:
            w.wait() if timeout is None else w.wait(timeout=timeout)
        self._tensor = self._header = None  # the receiver's copy is complete: the memory may be reused
        return True


class _IpcRecv:
    """wait(): maps the sender's tensor, copies it into the posted buffer, then acknowledges."""

    def __init__(self, buffer, header, header_work, src, group, tag):
        self._buffer, self._header, self._work = buffer, header, header_work
        self._src, self._group, self._tag = src, group, tag

    def wait(self, timeout=None) -> bool:
        self._work.wait() if timeout is None else self._work.wait(timeout=timeout)
        remote = unpack_descriptor(self._header)  # on CUDA: the current stream waits for the sender's event
        if remote.shape != self._buffer.shape or remote.dtype != self._buffer.dtype:
            want, got = f"{self._buffer.dtype}{tuple(self._buffer.shape)}", f"{remote.dtype}{tuple(remote.shape)}"
            raise RuntimeError(f"ipc receive from rank {self._src} (tag {self._tag}): expected {want}, got {got}")
        self._buffer.copy_(remote)
        if self._buffer.is_cuda:
            # The sender frees (or reuses) its memory as soon as it has the acknowledgement.
            torch.cuda.current_stream(self._buffer.device).synchronize()
        del remote
        dist.send(torch.ones(1, dtype=torch.uint8), dst=self._src, group=self._group, tag=self._tag + ACK_TAG_BASE)
        self._header = None
        return True


def pack_descriptor(tensor: torch.Tensor) -> torch.Tensor:
    """A uint8 CPU tensor of HEADER_BYTES: 8 bytes of length, then `tensor` pickled the way
    torch.multiprocessing passes it to another process (CUDA: an IPC memory handle and an event;
    CPU: its storage moved to shared memory, passed as a file descriptor)."""
    import torch.multiprocessing  # noqa: F401  (registers the tensor reductions with ForkingPickler)
    from multiprocessing.reduction import ForkingPickler

    blob = bytes(ForkingPickler.dumps(tensor))
    if len(blob) + 8 > HEADER_BYTES:
        raise RuntimeError(f"ipc descriptor of {len(blob)} bytes exceeds HEADER_BYTES={HEADER_BYTES}")
    out = torch.zeros(HEADER_BYTES, dtype=torch.uint8)
    out[:8] = torch.tensor(list(len(blob).to_bytes(8, "little")), dtype=torch.uint8)
    out[8:8 + len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    return out


def unpack_descriptor(header: torch.Tensor) -> torch.Tensor:
    """The tensor of pack_descriptor's header, mapping the sender's memory (CUDA IPC or shared memory)."""
    n = int.from_bytes(bytes(header[:8].tolist()), "little")
    return pickle.loads(bytes(header[8:8 + n].tolist()))


class IpcP2P:
    """Point-to-point by memory mapping, for ranks of one host (see the module docstring).

    Send: share the tensor, post its descriptor (a CPU header) with the message's tag, and post the
    receive of the acknowledgement; the work's wait() returns once the receiver has copied the data,
    and only then drops the reference that keeps the memory from being reused. Receive: post the
    header's receive; wait() maps and copies. The group must carry CPU tensors (gloo). Cost per
    message: one IPC open on the receiver, one device-to-device copy, two small CPU messages."""

    name = "ipc"

    def post(self, ops, group) -> list:
        works = []
        for send, t, peer, tag in ops:
            if send:
                t = t.detach()
                if t.is_cuda:
                    # The descriptor carries an event the receiver's rebuild waits for, but only when it
                    # opens the memory anew: a rebuild served from torch's cache of open storages skips
                    # it. So the data is complete before its descriptor leaves (one host wait per send).
                    torch.cuda.current_stream(t.device).synchronize()
                header = pack_descriptor(t)
                header_work = dist.isend(header, dst=peer, group=group, tag=tag)
                ack = torch.zeros(1, dtype=torch.uint8)
                works.append(_IpcSend(t, header_work, dist.irecv(ack, src=peer, group=group, tag=tag + ACK_TAG_BASE),
                                      header))
            else:
                header = torch.empty(HEADER_BYTES, dtype=torch.uint8)
                works.append(_IpcRecv(t, header, dist.irecv(header, src=peer, group=group, tag=tag), peer, group, tag))
        return works


def make_transport(name: str):
    """TorchP2P for 'gloo' and 'nccl', IpcP2P for 'ipc'."""
    if name not in TRANSPORTS:
        raise ValueError(f"unknown pipeline transport {name!r}; use one of {TRANSPORTS}")
    return IpcP2P() if name == "ipc" else TorchP2P()
