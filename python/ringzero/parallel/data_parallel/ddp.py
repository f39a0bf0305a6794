"""Data parallelism with bucketed gradient all-reduce overlapped with backward, on ringzero's collectives.

Parameters are grouped into flat buckets in reverse registration order (roughly the order backward
produces their gradients). Each gradient is copied into its bucket as soon as autograd accumulated it;
a full bucket is averaged with an async ringzero.all_reduce while backward goes on, and at the end of
backward the averaged buckets are copied back into param.grad.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn

from ... import comm
from ...comm.types import ReduceOp
from .flat import FlatLayout, bucket_params
from .grad_ready import GradReadyTracker

MIB = 1 << 20


def resolve_group(process_group, who: str):
    """The process group to use (None: the default group); clear error when there is none."""
    if not dist.is_initialized():
        raise ValueError(f"{who} needs torch.distributed.init_process_group(...) to have been called first")
    if process_group is None:
        return dist.group.WORLD
    if not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(f"{who}: process_group must be a ProcessGroup (e.g. Mesh().group('dp')) or None, "
                        f"got {type(process_group).__name__}")
    return process_group


BROADCAST_CHUNK_BYTES = 4 * MIB  # bounds the extra memory of the wrap-time broadcast


def broadcast_module_state(module: nn.Module, group):
    """Copies rank 0's (of `group`) parameters and buffers into every rank's, coalesced into broadcasts
    of at most BROADCAST_CHUNK_BYTES per dtype (a larger tensor goes alone, in place).
    Every rank of `group` must call it with modules of the same structure."""
    tensors = [p.data for p in module.parameters()] + [b for b in module.buffers()]
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for dtype in sorted(by_dtype, key=str):  # same order on every rank
        chunk, nbytes = [], 0
        for t in by_dtype[dtype] + [None]:
            if chunk and (t is None or nbytes + t.numel() * t.element_size() > BROADCAST_CHUNK_BYTES):
                _broadcast_coalesced(chunk, group)
                chunk, nbytes = [], 0
            if t is not None:
                chunk.append(t)
                nbytes += t.numel() * t.element_size()


def _broadcast_coalesced(ts, group):
    if len(ts) == 1 and ts[0].is_contiguous():
        comm.broadcast(ts[0], group=group, group_src=0)
        return
    flat = torch.cat([t.reshape(-1) for t in ts])
    comm.broadcast(flat, group=group, group_src=0)
    offset = 0
    for t in ts:
        t.copy_(flat[offset: offset + t.numel()].view_as(t))
        offset += t.numel()


def check_bucket_cap(bucket_cap_mb) -> int:
    if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) or bucket_cap_mb <= 0:
        raise ValueError(f"bucket_cap_mb must be a positive number of MiB, got {bucket_cap_mb!r}")
    return max(1, int(bucket_cap_mb * MIB))


class DistributedDataParallel(nn.Module):
    """Wraps `module` for data parallelism over `process_group` (default: the world).

    Every rank of the group must wrap a module of the same structure; rank 0's parameters and buffers
    are broadcast to the others here. forward() is the module's; after loss.backward() every
    parameter's .grad holds the average over ranks. Buffers are broadcast at wrap time only.

    grad_dtype: dtype of the buckets (e.g. torch.bfloat16 halves the bytes moved; gradients are
      converted back to the parameter dtype); None keeps each parameter's dtype.
    find_unused_parameters: allow parameters that get no gradient in some backward (their share is
      zero; a parameter unused on every rank keeps .grad as it was, as in torch DDP). Without it such
      a parameter raises at the end of backward.
    """

    def __init__(self, module: nn.Module, process_group=None, bucket_cap_mb: float = 25, grad_dtype=None,
                 find_unused_parameters: bool = False):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"DistributedDataParallel: module must be an nn.Module, got {type(module).__name__}")
        if grad_dtype is not None and (not isinstance(grad_dtype, torch.dtype) or not grad_dtype.is_floating_point):
            raise TypeError(f"DistributedDataParallel: grad_dtype must be a floating torch.dtype or None, got {grad_dtype!r}")
        self.module = module
        self.group = resolve_group(process_group, "DistributedDataParallel")
        self.world = dist.get_world_size(self.group)
        self.grad_dtype = grad_dtype
        self.find_unused_parameters = bool(find_unused_parameters)
        broadcast_module_state(module, self.group)

        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        dtype_of = (lambda p: grad_dtype or p.dtype)
        # One "rank" per bucket: DDP buckets are not sharded, FlatLayout only gives the offsets.
        self.buckets = [FlatLayout(b, 1, 0) for b in bucket_params(reversed(named), check_bucket_cap(bucket_cap_mb), dtype_of)]
        # On the parameters' device: CUDA gradients are averaged by the CUDA path, never through the host.
        # CPU buckets are registered (comm.flat_zeros): the all-reduce reads the peers' buckets in place.
        self.flats = [comm.flat_zeros(b.padded_numel, dtype_of(b.params[0]), b.params[0].device, self.group)
                      for b in self.buckets]
        self._slot = {id(s.param): s for b in self.buckets for s in b.slots}
        self._sync = True
        self._works = []
        self._missing: list[nn.Parameter] = []
        self._tracker = GradReadyTracker([b.params for b in self.buckets], self._copy_in, self._launch,
                                         self._on_missing, self._finish, enabled=lambda: self._sync)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate local gradients in param.grad without communicating;
        the first backward outside averages the accumulated sums."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    # ---- backward hooks ------------------------------------------------------------------------
    def _copy_in(self, g: int, p: nn.Parameter, group_done: bool):
        self.buckets[g].view(self.flats[g], self._slot[id(p)]).copy_(p.grad)

    def _launch(self, g: int):
        self._works.append(comm.all_reduce(self.flats[g], op=ReduceOp.AVG, group=self.group, async_op=True))

    def _on_missing(self, g: int, params):
        if not self.find_unused_parameters:
            names = [self._slot[id(p)].name for p in params]
            raise RuntimeError(f"DistributedDataParallel: parameters {names} got no gradient in this backward; "
                               "pass find_unused_parameters=True if the model does not use every parameter")
        for p in params:
            view = self.buckets[g].view(self.flats[g], self._slot[id(p)])
            view.copy_(p.grad) if p.grad is not None else view.zero_()
        self._missing.extend(params)

    def _finish(self):
        works, self._works = self._works, []
        missing, self._missing = self._missing, []
        for w in works:
            w.wait()
        globally_unused = set()
        if self.find_unused_parameters:
            # A parameter unused on every rank keeps .grad unchanged (torch DDP's rule): one small MAX.
            params = [s.param for b in self.buckets for s in b.slots]
            missing_ids = {id(p) for p in missing}
            used = torch.tensor([0 if id(p) in missing_ids else 1 for p in params], dtype=torch.int32)
            comm.all_reduce(used, op=ReduceOp.MAX, group=self.group)
            globally_unused = {id(p) for p, u in zip(params, used.tolist()) if not u}
        for b, flat in zip(self.buckets, self.flats):
            for s in b.slots:
                if id(s.param) in globally_unused:
                    continue
                avg = b.view(flat, s)
                if s.param.grad is None:
                    s.param.grad = avg.to(s.param.dtype, copy=True)
                else:
                    s.param.grad.copy_(avg)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """torch.nn.utils.clip_grad_norm_ over the module (gradients are identical on every rank)."""
        return torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm, norm_type)
