"""ZeRO++-style communication for ZeRO-3 across hosts (Wang et al. 2023): fewer bytes on the link between
hosts, where ringzero's collectives already run at the link's bound.

  hpz   a secondary copy of each unit's weights, sharded over the ranks of one host: the all-gather of a
        unit's backward (and of any forward before the next optimizer step) runs in shared memory and
        never crosses hosts. Costs padded_numel / ranks-per-host parameters per rank, per unit, kept
        between forward and the next step.
  qw    the all-gather of the weights from the master shards in block-quantized int8 (quantize.py: a
        float32 scale per block of 256 values): a quarter of float32's bytes. The masters and the
        optimizer stay float32; forward and backward read the dequantized weights (the same on every rank,
        and the same in backward as in forward). Across hosts in two steps: over the cross-host group, then
        in the host, where each rank's rows are dequantized straight from its registered buffer
        (gather_dequantize).
  qg    the gradients' reduce-scatter as a hierarchical all-to-all: in the host in full precision (shared
        memory), then across hosts each host's partial sums quantized once (int4 for `qg`/`qg4`, int8 for
        `qg8`), exchanged with one all-to-all among the ranks of one local index, and summed in float32
        by the receiver. One quantization per value whatever the number of hosts and ranks, so the error
        does not grow with them; `ef` keeps each rank's quantization error and adds it to its next step's
        partial sums (error feedback).

On one host hpz and qg change nothing (there is no link to save), and qw still quantizes (it is the user's
choice; it only costs there). Every rank of the group must pass the same options.

Each option is a swappable part of a flat group's communication (zero_comm.py): hpz and qw are parameter
gathers (zeropp_gather.py), qg a gradient reduction (QuantizedReduceScatter, below); communication() picks
them once from the options and the hosts, and ShardedGroup never asks which it holds.

CPU and CUDA tensors take the same steps, written once: the buffers live on the module's device, the
quantization runs there (csrc/core/quantize_kernels.inc; csrc/cuda/quantize.cu, the same bytes), the packed
rows travel as int32 words (quantize.words: every packed row is a whole number of words), and qg's background
step runs on the stream its caller was on. What differs is below this file: ringzero's collectives pick shared
memory and gloo, or CUDA IPC and NCCL, by the tensors' device; qg's all-to-all is torch's on the exchange group
(gloo stages CUDA tensors through the host, NCCL takes them directly); qw's fused host step
(comm.all_gather_dequantize) is CPU only, and CUDA gathers the int8 rows, then dequantizes. The CUDA form has
run on no GPU yet, and across hosts it needs a GPU per rank (NCCL).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import threading

import torch
import torch.distributed as dist

from ... import comm
from ...comm.types import ReduceOp
from ..mesh import subgroups
from . import quantize as qz
from .quantize import words
from .zero_comm import GradReduceScatter, GroupShape, PendingReduce, PlainGather, ReduceScatter, ZeroComm
from .zeropp_gather import QuantizedGather, QuantizedGatherAcrossHosts, SecondaryGather

NAMES = ("hpz", "qw", "qg", "qg4", "qg8", "ef")


@dataclasses.dataclass(frozen=True)
class ZeroPP:
    hpz: bool = False
    qw: bool = False
    qg_bits: int = 0
    """0: gradients reduce-scattered in full precision; 8 or 4: quantized across hosts."""
    error_feedback: bool = False
    block: int = 256

    @property
    def any(self) -> bool:
        return self.hpz or self.qw or bool(self.qg_bits)

    def names(self) -> str:
        parts = (["hpz"] if self.hpz else []) + (["qw"] if self.qw else []) + \
                ([f"qg{self.qg_bits}"] if self.qg_bits else []) + (["ef"] if self.error_feedback else [])
        return ",".join(parts) or "none"


def parse(value, where: str = "zeropp") -> ZeroPP:
    """None, a ZeroPP, or names (a comma-separated string or a list) from NAMES: 'qg' is int4 ('qg4'), as
    ZeRO++'s; 'ef' (error feedback) needs one of the qg names."""
    if value is None or value == "" or value == "none":
        return ZeroPP()
    if isinstance(value, ZeroPP):
        return value
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [str(v).strip().lower() for v in items if str(v).strip()]
    bad = [n for n in names if n not in NAMES]
    if bad:
        raise ValueError(f"{where}: unknown option(s) {bad}; choose from {', '.join(NAMES)} (e.g. 'hpz,qw,qg')")
    qg = [n for n in names if n.startswith("qg")]
    if len(set(qg)) > 1:
        raise ValueError(f"{where}: give one of qg, qg4, qg8, got {qg}")
    bits = {"qg": 4, "qg4": 4, "qg8": 8}[qg[0]] if qg else 0
    if "ef" in names and not bits:
        raise ValueError(f"{where}: 'ef' (error feedback) applies to quantized gradients; add qg, qg4 or qg8")
    return ZeroPP(hpz="hpz" in names, qw="qw" in names, qg_bits=bits, error_feedback="ef" in names)


class HostSplit:
    """The hosts of a ZeRO group, as ringzero's topology sees them (RINGZERO_HOST_ID included), and the two
    kinds of subgroups ZeRO++ needs: the group's ranks on this host (`host_group`, for hpz's secondary
    all-gather and qg's in-host reduce-scatter) and this rank's cross-host groups (the ranks of the same
    local index on every host: `cross_group` for qw's gather, `exchange_group` for qg's all-to-all). Collective: every rank of `group` builds every
    subgroup (dist.new_group), in the same order."""

    def __init__(self, group, where: str = "ZeroDataParallel"):
        info = comm.group_info(group)
        topo = info.topology
        hosts = list(topo.hosts.values())  # group ranks per host, hosts in order of their lowest rank
        if len({len(h) for h in hosts}) != 1:
            sizes = {h: len(r) for h, r in topo.hosts.items()}
            raise ValueError(f"{where}: zeropp needs the same number of ranks on every host, got {sizes}; "
                             "run as many ranks per host on each, or drop zeropp")
        self.host_ranks = hosts
        self.num_hosts, self.local_world = len(hosts), len(hosts[0])
        self.rank = topo.rank
        self.timeout_s = info.timeout_s
        self.host_index = next(i for i, h in enumerate(hosts) if topo.rank in h)
        self.local_index = hosts[self.host_index].index(topo.rank)
        glob = info.global_ranks
        # dist.new_group orders a subgroup's ranks by global rank: so do these lists, which say which group
        # rank is at each position of a subgroup.
        self.host_order = sorted(hosts[self.host_index], key=lambda r: glob[r])  # host-group position -> rank
        cross_hosts = [sorted(range(self.num_hosts), key=lambda h: glob[hosts[h][j]])
                       for j in range(self.local_world)]  # per local index: cross-group position -> host
        self.cross_hosts = cross_hosts[self.local_index]
        self.host_position = self.host_order.index(topo.rank)
        self.cross_position = self.cross_hosts.index(self.host_index)
        self.host_group = group if self.num_hosts == 1 else None
        self.cross_group = self.exchange_group = None
        if self.num_hosts > 1:
            # The host's ranks; and twice the ranks of one local index on every host: ringzero's collectives
            # (qw's gather, in the calling thread's order) and qg's all-to-all (on the background thread), so
            # that two threads never issue calls on one process group, whose calls must come in one order on
            # every rank. Their waits end after the group's RINGZERO_TIMEOUT_S, as ringzero's own do.
            by_host = [[glob[r] for r in ranks] for ranks in hosts]
            by_index = [[glob[h[j]] for h in hosts] for j in range(self.local_world)]
            self.host_group, self.cross_group, self.exchange_group = subgroups([by_host, by_index, by_index],
                                                                               info.timeout_s)
        # qg's in-host reduce-scatter input: the gradient blocks rearranged so that host position i's
        # chunk holds the blocks of the cross group of position i's rank, in that group's order.
        order = []
        for member in self.host_order:
            j = hosts[self.host_index].index(member)
            order += [hosts[h][j] for h in cross_hosts[j]]
        self.gather_rows = torch.tensor(order, dtype=torch.long)
        # A gather over the cross-host group, then over the host group, gives the group ranks' blocks in
        # this order (the same as gather_rows'); None where that is already group-rank order.
        self.gathered_order = None if order == list(range(len(order))) else self.gather_rows
        self._row_order = None  # gather_dequantize's row order, made at its first call
        self._executor = None

    def gather_dequantize(self, packed: torch.Tensor, out: torch.Tensor, numel: int, bits: int, block: int) -> bool:
        """qw's step in the host with the dequantization fused into it (comm.all_gather_dequantize): packed (H
        rows of quantize()'s layout, CPU, in a window of host_group: comm.flat_zeros) from every rank of the
        host, dequantized straight into out (world rows of numel float32) in the group ranks' order; no staging
        copy of the int8 rows. False (nothing done; the caller gathers, then dequantizes) where that cannot
        run. Ordered among the host group's collectives as any of them."""
        if self._row_order is None:
            order = self.gathered_order if self.gathered_order is not None else torch.arange(len(self.gather_rows))
            self._row_order = order.to(torch.long).contiguous()
        return comm.all_gather_dequantize(out, packed, numel, bits, block, self._row_order, group=self.host_group)

    @property
    def several_hosts(self) -> bool:
        return self.num_hosts > 1

    def background(self) -> concurrent.futures.ThreadPoolExecutor:
        """One thread for qg's cross-host steps, in submission order (the same on every rank)."""
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ringzero-zeropp")
        return self._executor

    def close(self):
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


class QuantizedPending(PendingReduce):
    """qg's reduction in flight: a future (whose result is None, or on CUDA an event recorded after its kernels
    and its device) and an event set once the in-host step is over."""

    holds_input = True

    def __init__(self, future: concurrent.futures.Future, host_done: threading.Event, out: torch.Tensor,
                 timeout_s: float):
        super().__init__(future, out)
        self.host_done, self.timeout_s = host_done, timeout_s

    def wait(self):
        """The waiter's current stream waits on the event where there is one (the waiting thread may be on
        another stream than the starting one: autograd's device threads)."""
        done = self.work.result()
        if done is not None:
            event, device = done
            torch.cuda.current_stream(device).wait_event(event)

    def release_input(self) -> bool:
        # Bounded: a wait past the group's timeout leaves it to wait(), which raises the step's error.
        return self.host_done.wait(self.timeout_s)


class QuantizedReduceScatter(GradReduceScatter):
    """qg for one flat group: out (shard numel c, float32) = the AVG over the group of block `rank` of
    grad_flat (world * c), reduced in the host in full precision and across hosts from quantized partials.
    start() issues the in-host reduce-scatter on the calling thread (so every rank orders it among the host
    group's collectives alike) and the rest on the split's background thread. Its row_order is the in-host
    step's (HostSplit.gather_rows)."""

    def __init__(self, split: HostSplit, bits: int, block: int, error_feedback: bool):
        self.split, self.bits, self.block, self.error_feedback = split, bits, block, error_feedback
        self.residual = None

    def bind(self, shape: GroupShape):
        super().bind(shape)
        self.c, self.world, self.device = shape.shard_numel, shape.world, torch.device(shape.device)
        if self.error_feedback:
            self.residual = torch.zeros(self.split.num_hosts, self.c, device=self.device)
        self.row_order = self.split.gather_rows.tolist()

    def start(self, grad_flat: torch.Tensor, arranged: bool = False) -> QuantizedPending:
        """CUDA tensors: the background step runs on the caller's current stream, after what the caller queued
        before; the pending reduction's wait() orders the waiter's stream after it."""
        s, c, H = self.split, self.c, self.split.num_hosts
        out = torch.empty(c, dtype=torch.float32, device=self.device)
        if arranged or s.gathered_order is None:
            staged = grad_flat.view(-1)
        else:
            rows = s.gather_rows.to(grad_flat.device)
            staged = grad_flat.view(self.world, c).index_select(0, rows).view(-1)
        part = torch.empty(H * c, dtype=grad_flat.dtype, device=grad_flat.device)
        work = comm.reduce_scatter_single(part, staged, op=ReduceOp.SUM, group=s.host_group, async_op=True)
        host_done = threading.Event()
        stream = torch.cuda.current_stream(grad_flat.device) if grad_flat.is_cuda else None
        future = s.background().submit(self._on_stream, stream, work, [staged], host_done, part, out)
        return QuantizedPending(future, host_done, out, s.timeout_s)

    def _on_stream(self, stream, *args):
        if stream is None:
            self._cross(*args)
            return None
        with torch.cuda.device(stream.device), torch.cuda.stream(stream):
            self._cross(*args)
            done = torch.cuda.Event()
            done.record(stream)
        return done, stream.device

    def _cross(self, work, staged, host_done, part, out):
        try:
            work.wait()  # CUDA: the current stream (the caller's) waits for the in-host step
        finally:
            staged.clear()  # the in-host step's input, the group's full size
            host_done.set()
        s, c, H = self.split, self.c, self.split.num_hosts
        own = s.cross_position
        rows = part.view(H, c).float()  # row i: this host's partial sums for cross-group rank i's block
        send = rows
        if self.residual is not None:
            send = rows + self.residual
        # The own row travels to this rank itself and is replaced by the exact one below, so it is sent
        # as zeros, not quantized; the other hosts' rows, before and after it, are.
        others = [(a, b) for a, b in ((0, own), (own + 1, H)) if b > a]
        packed = torch.empty(H, qz.packed_bytes(c, self.bits, self.block), dtype=torch.uint8, device=part.device)
        packed[own].zero_()
        for a, b in others:
            qz.quantize(send[a:b], self.bits, self.block, out=packed[a:b])
        if self.residual is not None:
            for a, b in others:
                self.residual[a:b].copy_(send[a:b] - qz.dequantize(packed[a:b], c, self.bits, self.block))
            self.residual[own].zero_()  # the own row is never quantized
        recv = torch.empty_like(packed)
        dist.all_to_all_single(words(recv), words(packed), group=s.exchange_group)
        partials = torch.empty(H, c, device=part.device)  # every host's partials of my block
        for a, b in others:
            qz.dequantize(recv[a:b], c, self.bits, self.block, out=partials[a:b])
        partials[own] = rows[own]  # this host's own, exact
        out.copy_(partials.sum(dim=0).div_(self.world))


def communication(opts: ZeroPP, split: HostSplit | None) -> ZeroComm:
    """The gather and reduction forms of every flat group of one ZeroDataParallel with options `opts` over
    `split`'s hosts (None: no options): the one place that turns the options into classes. On one host hpz
    and qg have no link to save and take the plain forms; qw still quantizes there (the user's choice)."""
    several = split is not None and split.several_hosts
    gather = PlainGather
    if opts.qw:
        gather = (functools.partial(QuantizedGatherAcrossHosts, opts.block, split) if several
                  else functools.partial(QuantizedGather, opts.block))
    reduce_scatter = ReduceScatter
    if opts.qg_bits and several:
        reduce_scatter = functools.partial(QuantizedReduceScatter, split, opts.qg_bits, opts.block, opts.error_feedback)
    repeated = (lambda: SecondaryGather(gather(), split)) if opts.hpz and several else None
    return ZeroComm(gather, reduce_scatter, repeated)
