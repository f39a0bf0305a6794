"""The communication of a ZeRO flat group as two swappable parts, handed to ShardedGroup at construction:
a ParamGather (master shards -> full weights) and a GradReduceScatter (gradient buffer -> this rank's averaged
shard). The plain forms live here, ZeRO++'s in zeropp_gather.py and zeropp.py; a variant is another class.
Which classes one ZeroDataParallel takes is decided once, where ZeRO is configured (ZeroComm, made in
zero.py), and each group gets instances of its own (they hold the group's buffers).

The order contract of every form: ShardedGroup calls bind() once, in its constructor, on every rank of the
group alike (a form may register buffers there, which is collective); then start() and finish() (resp.
start() and the pending reduction's wait()) in the same order on every rank, as for any collective.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from ... import comm
from ...comm.types import ReduceOp


@dataclasses.dataclass(frozen=True)
class GroupShape:
    """What a gather or a reduction knows of its flat group (flat.py's FlatLayout: padded_numel = world *
    shard_numel)."""

    group: object
    """The process group the shards are spread over."""
    world: int
    shard_numel: int
    padded_numel: int
    param_dtype: torch.dtype
    """dtype of the full weights (`full`)."""
    reduce_dtype: torch.dtype
    """dtype of the gradient buffer."""
    device: torch.device
    """The compute device: where `full` and the gradient buffer live."""


class ParamGather:
    """Fills a group's full weights from every rank's master shard. Forms keep their in-flight state between
    start() and finish(); one gather is in flight at a time."""

    shape: GroupShape

    def bind(self, shape: GroupShape) -> None:
        """Takes the group's shape and makes the buffers the form keeps (collective: see the module docstring)."""
        self.shape = shape

    def start(self, master: torch.nn.Parameter, full: torch.Tensor) -> str:
        """Starts gathering `master` (this rank's float32 shard, 1D; its version counter says when it
        changed) into `full` (1D padded, param_dtype). Returns the source it reads, for the group's
        count of gathers ("master", "qw", "secondary")."""
        raise NotImplementedError

    def finish(self, full: torch.Tensor) -> None:
        """Waits for the gather started last; `full` then holds every rank's shard in rank order."""
        raise NotImplementedError

    def start_early(self, master: torch.nn.Parameter) -> None:
        """May start ahead of start() the part of the next gather that does not touch `full` (qw's cross-host
        step); start() then does the rest. Every rank of the group calls it alike. Default: nothing."""

    def forget(self) -> None:
        """The masters changed behind their version counter: drop any copy of the weights kept for later
        gathers (hpz's secondary). Default: nothing kept."""

    def kept_bytes(self) -> int:
        """Bytes of weights kept between gathers besides `full` (hpz's secondary), for memory accounting."""
        return 0

    def parts(self):
        """This gather and the ones it wraps, outermost first (for counters kept by a wrapped form)."""
        yield self


class PlainGather(ParamGather):
    """The all-gather of the master shards over the group, in param_dtype."""

    def start(self, master, full):
        m, s = master.detach(), self.shape
        if m.dtype == s.param_dtype and m.device == s.device:
            # Read in place (no copy of the shard while the gather is in flight): nothing writes the master
            # between here and finish(); ShardedGroup checks that through its version counter.
            self._input = m
        else:
            self._input = m.to(s.device, s.param_dtype, copy=True)
        self._work = comm.all_gather_single(full, self._input, group=s.group, async_op=True)
        return "master"

    def finish(self, full):
        self._work.wait()
        self._work = self._input = None


class PendingReduce:
    """A gradient reduction in flight. `out` (shard_numel) holds this rank's averaged shard once wait() returned.
    holds_input: the reduction keeps the gradient buffer alive itself until release_input() says it is done
    with it, so the group drops its own reference at start (qg's in-host step); False: the group keeps the
    buffer until wait()."""

    holds_input = False

    def __init__(self, work, out: torch.Tensor):
        self.work, self.out = work, out

    def wait(self) -> None:
        self.work.wait()

    def release_input(self) -> bool:
        """Waits until the reduction no longer holds a buffer of the group's full size; False where only
        wait() releases it."""
        return False


class GradReduceScatter:
    """Averages a group's gradient buffer (1D padded, reduce_dtype) over the group into this rank's shard."""

    shape: GroupShape
    row_order: list[int] | None = None
    """The order the reduction reads the buffer's shard-sized rows in (physical row i holds the layout's row
    row_order[i]); the group then writes each gradient straight into that order. None: the layout's order."""

    def bind(self, shape: GroupShape) -> None:
        """Takes the group's shape (collective: see the module docstring)."""
        self.shape = shape

    def start(self, grad_flat: torch.Tensor, arranged: bool = False) -> PendingReduce:
        """Starts the reduction of grad_flat. arranged: its rows are in row_order already (else in the
        layout's order, and a form with a row_order reads a rearranged copy)."""
        raise NotImplementedError


class ReduceScatter(GradReduceScatter):
    """The reduce-scatter (average) over the group, in reduce_dtype."""

    def start(self, grad_flat, arranged=False):
        s = self.shape
        out = torch.empty(s.shard_numel, dtype=s.reduce_dtype, device=s.device)
        return PendingReduce(comm.reduce_scatter_single(out, grad_flat, op=ReduceOp.AVG, group=s.group,
                                                        async_op=True), out)


@dataclasses.dataclass(frozen=True)
class ZeroComm:
    """The forms every flat group of one ZeroDataParallel takes, chosen once where ZeRO is configured; each
    field makes a fresh instance per group."""

    gather: Callable[[], ParamGather] = PlainGather
    """Makes the gather from the masters."""
    reduce_scatter: Callable[[], GradReduceScatter] = ReduceScatter
    """Makes the gradient reduction of groups that shard their gradients (GradReduction.REDUCE_SCATTER)."""
    repeated_gather: Callable[[], ParamGather] | None = None
    """Makes the gather of a group gathered more than once per step (stage 3's units, not its root): hpz's
    in-host secondary around `gather`. None: `gather`."""

    def make_gather(self, repeated: bool) -> ParamGather:
        """A fresh gather for one group; repeated: the group is gathered more than once per step."""
        return (self.repeated_gather or self.gather)() if repeated else self.gather()
