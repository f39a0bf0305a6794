"""One pipeline stage on this rank: its module, its neighbours, and the compute of F, B, I and W.

A stage takes one tensor and returns one tensor. Per microbatch it keeps its input (which requires
grad, so that the backward yields the gradient to send back) and its output until the backward is
done, then drops both: activation memory is freed as soon as its backward has run.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from .weight_grad import WeightGradStore, install


class PipelineStage:
    """`module` is stage `stage_index` of `num_stages`; `group` is the pipeline group (None: default group).

    Stage s lives on group rank s % group size (one stage per rank, or several for interleaved
    schedules); every rank builds its own stages with the same num_stages and group.
    """

    def __init__(self, module: nn.Module, stage_index: int, num_stages: int, group=None):
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
        if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
            raise ValueError(f"num_stages must be a positive int, got {num_stages!r}")
        if isinstance(stage_index, bool) or not isinstance(stage_index, int) or not 0 <= stage_index < num_stages:
            raise ValueError(f"stage_index must be an int in [0, {num_stages}), got {stage_index!r}")
        if not dist.is_initialized():
            raise ValueError("PipelineStage needs torch.distributed.init_process_group(...) first")
        self.module = module
        self.index = stage_index
        self.num_stages = num_stages
        self.group = group or dist.group.WORLD
        size = dist.get_world_size(self.group)
        if num_stages % size:
            raise ValueError(f"num_stages={num_stages} must be a multiple of the pipeline group size {size}")
        if stage_index % size != dist.get_rank(self.group):
            raise ValueError(f"stage {stage_index} lives on pipeline rank {stage_index % size}, "
                             f"not on this rank ({dist.get_rank(self.group)})")
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        self.prev_rank = None if self.is_first else dist.get_global_rank(self.group, (stage_index - 1) % size)
        self.next_rank = None if self.is_last else dist.get_global_rank(self.group, (stage_index + 1) % size)
        self.weight_grads: WeightGradStore | None = None
        self._saved: dict[int, tuple] = {}  # microbatch -> (input, output or weighted loss)
        self._shape_cache: dict = {}

    def enable_split_backward(self) -> None:
        """Lets backward_input defer the weight gradients of Linear layers to backward_weight."""
        if self.weight_grads is None:
            self.weight_grads = WeightGradStore()
            install(self.module, self.weight_grads)

    def output_meta(self, shape: tuple, dtype: torch.dtype) -> tuple[tuple, torch.dtype]:
        """(shape, dtype) of this stage's output for an input of `shape`/`dtype`, found on the meta
        device (no compute, no memory) and cached per input shape."""
        key = (tuple(shape), dtype)
        if key not in self._shape_cache:
            # A DDP/ZeRO wrapper exposes its flat master shards as parameters; shapes come from the module it
            # wraps (whose parameters keep their shapes even while ZeRO-3 has freed their storage).
            inner = self.module.module if isinstance(getattr(self.module, "module", None), torch.nn.Module) else self.module
            state = {n: torch.empty_like(t, device="meta") for n, t in
                     list(inner.named_parameters()) + list(inner.named_buffers())}
            with torch.no_grad():
                out = torch.func.functional_call(inner, state, (torch.empty(shape, dtype=dtype, device="meta"),))
            if not isinstance(out, torch.Tensor):
                raise TypeError(f"stage {self.index} must return one tensor, returned {type(out).__name__}")
            self._shape_cache[key] = (tuple(out.shape), out.dtype)
        return self._shape_cache[key]

    def forward(self, microbatch: int, x: torch.Tensor, loss_fn=None, target=None, weight: float = 1.0,
                keep: bool = True):
        """Runs the stage on x; on the last stage returns loss_fn(output, target) * weight (what the
        backward starts from), elsewhere the output. Keeps what the backward needs unless keep=False
        (evaluation: no backward will come)."""
        if not self.is_first:
            x = x.detach().requires_grad_(True)
        if self.weight_grads is not None:
            self.weight_grads.key = (self.index, microbatch)
        try:
            out = self.module(x)
        finally:
            if self.weight_grads is not None:
                self.weight_grads.key = None
        if self.is_last:
            out = loss_fn(out, target) * weight
        if keep:
            self._saved[microbatch] = (x, out)
        return out

    def backward(self, microbatch: int, grad_output: torch.Tensor | None) -> torch.Tensor | None:
        """Backward of one microbatch (B, or I when split backward is on: Linear weight gradients are
        then deferred). Accumulates parameter gradients; returns the input gradient (None on the first
        stage) and frees the microbatch's activations."""
        x, out = self._saved.pop(microbatch)
        if self.is_last:
            out.backward()
        else:
            torch.autograd.backward(out, grad_output)
        return None if self.is_first else x.grad

    def backward_weight(self, microbatch: int) -> None:
        """W: the deferred Linear weight gradients of one microbatch."""
        self.weight_grads.flush((self.index, microbatch))

    def held_microbatches(self) -> int:
        """Microbatches whose activations this stage still holds (0 after a complete step)."""
        pending = len(self.weight_grads.pending) if self.weight_grads is not None else 0
        return len(self._saved) + pending
