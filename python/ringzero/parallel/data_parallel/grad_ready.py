"""Counts gradients as autograd produces them and starts each group's reduction in a fixed order.

Used by DDP (buckets) and ZeRO (buckets, units). Why a fixed order: ringzero's collectives pair up
calls by position in each rank's sequence, so every rank must launch the same reductions in the same
order even when hooks fire in a different order (or a parameter is unused) on some rank. Group g is
launched only once groups 0..g-1 were; its gradients are still copied out as soon as they are ready.

Parameters that got no gradient in a backward are handed to `on_missing` at the end of that
backward (an autograd engine callback), then the remaining groups are launched and `on_finish` runs.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn


class GradReadyTracker:
    """groups: list of parameter lists (group index = launch order).

    on_grad(g, param, group_done): param.grad is final for this backward (copy it out, may set it to
      None); group_done says it was the last parameter of group g to arrive.
    on_launch(g): every parameter of group g is in; start its reduction (async).
    on_missing(g, params): at the end of backward, params of group g that got no gradient.
    on_finish(): at the end of backward, after every group was launched (wait, write results).
    enabled(): when False the hooks do nothing (no_sync).
    """

    def __init__(self, groups: list[list[nn.Parameter]], on_grad: Callable, on_launch: Callable,
                 on_missing: Callable, on_finish: Callable, enabled: Callable[[], bool] = lambda: True):
        self.groups = groups
        self.group_of = {}
        for g, params in enumerate(groups):
            for p in params:
                if id(p) in self.group_of:
                    raise ValueError("a parameter appears in two gradient groups (tied or shared parameters "
                                     "must be registered once)")
                self.group_of[id(p)] = g
        self.on_grad, self.on_launch, self.on_missing, self.on_finish = on_grad, on_launch, on_missing, on_finish
        self.enabled = enabled
        self.in_backward = False
        self.handles = [p.register_post_accumulate_grad_hook(self._hook) for params in groups for p in params]

    def _start(self):
        self.in_backward = True
        self.seen: set[int] = set()
        self.remaining = [len(params) for params in self.groups]
        self.next_launch = 0
        # Runs once the whole backward pass is done (same thread, after every hook).
        torch.autograd.Variable._execution_engine.queue_callback(self._end)

    def _hook(self, p: torch.Tensor):
        if not self.enabled():
            return
        if not self.in_backward:
            self._start()
        if id(p) in self.seen:  # the same leaf accumulated twice in one backward: count it once
            return
        self.seen.add(id(p))
        g = self.group_of[id(p)]
        self.remaining[g] -= 1
        self.on_grad(g, p, self.remaining[g] == 0)
        self._launch_ready()

    def _launch_ready(self):
        while self.next_launch < len(self.groups) and self.remaining[self.next_launch] == 0:
            self.on_launch(self.next_launch)
            self.next_launch += 1

    def _end(self):
        try:
            for g, params in enumerate(self.groups):
                missing = [p for p in params if id(p) not in self.seen]
                if missing:
                    self.on_missing(g, missing)
                    self.remaining[g] = 0
            self._launch_ready()
            self.on_finish()
        finally:
            self.in_backward = False

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []
