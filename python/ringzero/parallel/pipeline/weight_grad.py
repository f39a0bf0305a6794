"""Splitting the backward into I (input gradient) and W (weight gradient) for zero-bubble schedules.

While a stage runs a forward with a key set, its nn.Linear layers go through _DeferredLinear: the
backward then computes only the input gradient (grad_out @ weight) and stores (input, grad_out) under
the key; W later computes weight.grad += grad_out^T @ input and bias.grad += sum(grad_out). These two
matmuls are about half of a Linear's backward, which makes F, I and W cost about the same in a
transformer. Other parameters (LayerNorm, Embedding) get their gradients in I: they are cheap.
"""
from __future__ import annotations

from collections import defaultdict

import torch
import torch.nn as nn
import torch.nn.functional as F


class WeightGradStore:
    """Deferred Linear weight gradients, keyed by (stage, microbatch)."""

    def __init__(self):
        self.key = None  # set by the runtime around the forward of a (stage, microbatch)
        self.pending: dict = defaultdict(list)

    def flush(self, key) -> None:
        """Accumulates the deferred weight (and bias) gradients of `key` into .grad and frees their inputs."""
        with torch.no_grad():
            for weight, bias, x, g in self.pending.pop(key, []):
                g2 = g.reshape(-1, g.shape[-1])
                gw = g2.t().mm(x.reshape(-1, x.shape[-1]))
                weight.grad = gw if weight.grad is None else weight.grad.add_(gw)
                if bias is not None:
                    gb = g2.sum(0)
                    bias.grad = gb if bias.grad is None else bias.grad.add_(gb)


class _DeferredLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, store, key):
        ctx.save_for_backward(x, weight)
        ctx.bias, ctx.store, ctx.key = bias, store, key
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        ctx.store.pending[ctx.key].append((weight, ctx.bias, x, grad_out))
        grad_x = grad_out.matmul(weight) if ctx.needs_input_grad[0] else None
        return grad_x, None, None, None, None


def install(module: nn.Module, store: WeightGradStore) -> None:
    """Routes every nn.Linear inside `module` through the store while store.key is set.

    With store.key None the layers behave exactly as before (plain F.linear), so the shared modules
    of the unsplit model are unaffected outside the pipeline's forwards.
    """
    for layer in module.modules():
        if isinstance(layer, nn.Linear) and "forward" not in layer.__dict__:
            def forward(x, layer=layer):
                if store.key is None:
                    return F.linear(x, layer.weight, layer.bias)
                return _DeferredLinear.apply(x, layer.weight, layer.bias, store, store.key)
            layer.forward = forward


def uninstall(module: nn.Module) -> None:
    """Undoes install()."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            layer.__dict__.pop("forward", None)
