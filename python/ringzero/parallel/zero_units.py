"""ZeRO-3 units: which submodules are gathered as one, and the hooks that gather, prefetch and free them.

Order of events for unit i (each all-gather / reduce-scatter is issued in the same order on every
rank, because it follows the module's forward order and autograd's backward order, which are equal
on all ranks for the same model):
  forward pre-hook   wait for unit i's gather (or gather now); prefetch the next unit of forward order
  forward hook       hook unit i's outputs (their gradient arrives just before unit i's backward);
                     free unit i (reshard_after_forward)
  output grad hook   gather unit i again (prefetched by unit i+1's); prefetch the previous unit
  last param grad    free unit i (its gradients are in the reduce-scatter buffer)
"""
from __future__ import annotations

import functools

import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves

from .sharded_group import ParamState


def resolve_units(module: nn.Module, unit, named):
    """Returns (unit modules, their (name, param) lists, the root's (name, param) list).

    unit: None, a module class (every outermost submodule of that class with trainable parameters),
    or a list of distinct submodules of `module` that share no parameters."""
    name_of = {id(p): n for n, p in named}
    if unit is None:
        candidates = []
    elif isinstance(unit, type) and issubclass(unit, nn.Module):
        candidates = [m for m in module.modules() if m is not module and isinstance(m, unit)]
        if not candidates:
            raise ValueError(f"ZeroDataParallel: unit={unit.__name__} but the module has no submodule of that class")
    elif isinstance(unit, (list, tuple)):
        inside = {id(m) for m in module.modules()}
        for m in unit:
            if not isinstance(m, nn.Module):
                raise TypeError(f"ZeroDataParallel: unit list items must be nn.Modules, got {type(m).__name__}")
            if id(m) not in inside:
                raise ValueError("ZeroDataParallel: every module in unit= must be a submodule of the wrapped module")
        candidates = list(unit)
    else:
        raise TypeError("ZeroDataParallel: unit must be None, an nn.Module subclass or a list of submodules, "
                        f"got {type(unit).__name__}")
    claimed: set[int] = set()
    modules, unit_named = [], []
    by_class = isinstance(unit, type)
    for m in candidates:
        params = [(name_of[id(p)], p) for p in m.parameters() if id(p) in name_of]
        overlap = [n for n, p in params if id(p) in claimed]
        if overlap:
            if by_class:  # a nested instance of the class: its outermost ancestor already owns it
                continue
            raise ValueError(f"ZeroDataParallel: units share parameters {overlap[:3]}; pass disjoint submodules")
        if not params:
            continue
        claimed.update(id(p) for _, p in params)
        modules.append(m)
        unit_named.append(params)
    root = [(n, p) for n, p in named if id(p) not in claimed]
    return modules, unit_named, root


class UnitScheduler:
    """Installs the stage-3 hooks on `modules` (groups[i] holds modules[i]'s parameters)."""

    def __init__(self, modules, groups, prefetch: bool, reshard_after_forward: bool):
        self.modules, self.groups = modules, groups
        self.prefetch, self.reshard_after_forward = prefetch, reshard_after_forward
        self.last_order = list(range(len(modules)))  # forward order of the previous iteration
        self.order: list[int] = []
        self.backward_started: set[int] = set()
        self.handles = []
        for i, m in enumerate(modules):
            self.handles.append(m.register_forward_pre_hook(functools.partial(self._pre_forward, i)))
            self.handles.append(m.register_forward_hook(functools.partial(self._post_forward, i)))

    def begin_forward(self):
        if self.order:
            self.last_order = self.order
        self.order, self.backward_started = [], set()
        if self.prefetch and self.last_order:
            self._prefetch(self.last_order[0])

    def _prefetch(self, i: int):
        if self.groups[i].state is ParamState.SHARDED:
            self.groups[i].gather_async()

    def _pre_forward(self, i, module, args):
        self.order.append(i)
        self.groups[i].wait_gathered()
        if self.prefetch:
            pos = self.last_order.index(i) if i in self.last_order else -1
            if 0 <= pos < len(self.last_order) - 1:
                self._prefetch(self.last_order[pos + 1])

    def _post_forward(self, i, module, args, output):
        if torch.is_grad_enabled():
            for t in tree_leaves(output):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(functools.partial(self._pre_backward, i))
        if self.reshard_after_forward:
            self.groups[i].free()
        return None

    def _pre_backward(self, i, grad):
        if i not in self.backward_started:
            self.backward_started.add(i)
            self.groups[i].wait_gathered()
            if self.prefetch:
                pos = self.order.index(i)
                if pos > 0 and self.order[pos - 1] not in self.backward_started:
                    self._prefetch(self.order[pos - 1])
        return None

    def after_backward(self, group):
        """Every gradient of `group` was copied out: its full weights are no longer needed."""
        group.free()

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []
