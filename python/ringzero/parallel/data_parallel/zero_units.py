"""ZeRO stage 3 (ShardedUnits): weights sharded too, in units (groups of submodules) gathered just
before their forward and their backward (the next one prefetched while the current one computes) and
freed right after; which submodules form a unit, and the hooks that gather, prefetch and free them.

Order of events for unit i (each all-gather / reduce-scatter is issued in the same order on every
rank, because it follows the module's forward order and autograd's backward order, which are equal
on all ranks for the same model):
  forward pre-hook   wait for unit i's gather (or gather now); prefetch the next unit of forward order
  forward hook       hook unit i's outputs (their gradient arrives just before unit i's backward);
                     free unit i (reshard_after_forward)
  output grad hook   gather unit i again (prefetched by unit i+1's); prefetch the previous unit
  last param grad    free unit i (its gradients are in the reduce-scatter buffer)
The parameters outside every unit form the root group: gathered for the whole forward and backward.
"""
from __future__ import annotations

import functools

import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves

from .sharded_group import GradReduction, ParamState, ShardedGroup
from .zero_sharding import ShardSpec, ZeroSharding


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
    """Installs the stage-3 hooks on `modules` (groups[i] holds modules[i]'s parameters, SHARDED to
    begin with): forward order is recorded each iteration and drives the next one's prefetch."""

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


class ShardedUnits(ZeroSharding):
    """Stage 3 over `module`: one group per unit (resolve_units' `unit`), plus the root group of the
    parameters outside every unit (the whole module when there are no units). Every group starts
    SHARDED; gradients are reduce-scattered once a unit has them all (zero_sharding.py)."""

    def __init__(self, module: nn.Module, named, spec: ShardSpec, unit, prefetch: bool, reshard_after_forward: bool):
        unit_modules, unit_named, root_named = resolve_units(module, unit, named)
        # Each group is freed as soon as it is built: a rank never holds more than one unit's full weights.
        unit_groups = [self._sharded(spec.make(u, GradReduction.REDUCE_SCATTER)) for u in unit_named]
        # The root stays gathered from forward to the end of backward: an hpz secondary would never be read.
        self.root = (self._sharded(spec.make(root_named, GradReduction.REDUCE_SCATTER, repeated=False))
                     if root_named or not unit_groups else None)
        root = [self.root] if self.root is not None else []
        self.scheduler = UnitScheduler(unit_modules, unit_groups, prefetch, reshard_after_forward)
        # Backward produces the last unit's gradients first; the root (embedding) finishes last.
        super().__init__(unit_groups + root, reduce_order=unit_groups[::-1] + root)

    @staticmethod
    def _sharded(group: ShardedGroup) -> ShardedGroup:
        group.free()
        return group

    def gather_params(self, masters_changed: bool):
        """Nothing: each unit is gathered from its current master just before it is used."""

    def forward(self, module: nn.Module, args, kwargs):
        root = self.root
        if root is not None and root.state is ParamState.SHARDED:
            root.gather_async()
        for i in self.scheduler.last_order:  # what each unit's gather can start early (qw's cross-host step)
            if self.scheduler.groups[i].state is ParamState.SHARDED:
                self.scheduler.groups[i].gather_ahead()
        self.scheduler.begin_forward()  # prefetches the first unit behind the root's gather
        if root is not None:
            root.wait_gathered()
        out = module(*args, **kwargs)
        if not torch.is_grad_enabled() and root is not None:
            root.free()  # no backward will come to free it
        return out

    def _on_grad(self, i: int, p: nn.Parameter, group_done: bool):
        super()._on_grad(i, p, group_done)
        if group_done:
            self._after_backward(self.reduce_order[i])

    def _on_missing(self, i: int, params):
        super()._on_missing(i, params)
        self._after_backward(self.reduce_order[i])

    def _after_backward(self, g: ShardedGroup):
        if g is not self.root:  # the root stays gathered until the end of backward
            self.scheduler.after_backward(g)

    def _finish(self):
        super()._finish()
        for g in self.groups:
            if g.state is not ParamState.SHARDED:
                g.free()
