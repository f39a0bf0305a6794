"""The hierarchical all-reduce of the CPU and CUDA transports, written once: reduce-scatter inside the
host, one ring per local rank across hosts, all-gather inside the host. Each transport (transports.py
Hierarchical, cuda.py CudaHierarchical) passes its own three steps (shared memory and gloo; CUDA IPC and
NCCL); the staging is here.

[Note: AVG in the hierarchical all-reduce] the steps reduce with SUM and the caller divides by the world
size: the CPU cross-host ring folds the division into its last step (one rounding, as its flat ring
does); the CUDA path divides after the all-gather (the NCCL driver's AVG would divide by the number of
hosts only).
"""
from __future__ import annotations

import torch


def all_reduce_pipelined(x: torch.Tensor, local_world: int, segment_numel: int, reduce_scatter, cross_start,
                         cross_finish, all_gather, on_link=None, defer=None):
    """all_reduce_hierarchical's result, with the three steps pipelined over segments of x (the CPU path
    for large messages): the in-host steps of one segment overlap the cross-host step of another.

    x (flat, contiguous) is cut into segments of segment_numel elements (a multiple of local_world; the
    last may be shorter, padded with zeros in a copy). reduce_scatter(seg, part) and all_gather(part,
    seg) are as in all_reduce_hierarchical and run on the calling thread, in the same order on every
    local rank: RS(0), RS(1), AG(0), RS(2), AG(1), ..., AG(K-1). cross_start(part) starts the cross-host
    all-reduce of part in the background (in segment order) and returns a handle; cross_finish(handle)
    waits for it (bounded) and raises its error.

    Cost: with K segments the link is busy from the end of RS(0) to the start of AG(K-1); the in-host
    steps the link does not hide are one segment's reduce-scatter and one segment's all-gather.

    on_link(), if given, runs once segment 0 is on its way across hosts (before AG(0)). defer(), if given,
    is asked once the last segment is on its way (before its cross_finish): when it returns True, the call
    returns the rest (the last segment's cross_finish and AG, "the tail") as a function for the caller to
    run later, instead of running it ([Note: the engine's deferred tail], csrc/torch/backend_hosts.h);
    else it runs it and returns None. The result is the same either way.
    """
    L = local_world
    segments = list(x.split(segment_numel))
    tail = segments[-1]
    padded = -(-tail.numel() // L) * L
    parts = [seg.new_empty(-(-seg.numel() // L)) for seg in segments]
    handles = []
    for k, seg in enumerate(segments):
        if k == len(segments) - 1 and padded != tail.numel():
            # Only the last segment can be uneven. Its padded copy is made here, not before the loop: on_link
            # may have just written this memory (a tail left by the call before, [Note: the engine's
            # deferred tail]).
            seg = segments[-1] = torch.cat([tail, tail.new_zeros(padded - tail.numel())])
        reduce_scatter(seg, parts[k])
        handles.append(cross_start(parts[k]))
        if k == 0 and on_link is not None:
            on_link()
        if k >= 1:  # the previous segment's all-gather while this one crosses the link
            cross_finish(handles[k - 1])
            all_gather(parts[k - 1], segments[k - 1])

    def finish_last():
        cross_finish(handles[-1])
        all_gather(parts[-1], segments[-1])
        if segments[-1] is not tail:
            tail.copy_(segments[-1][:tail.numel()])

    if defer is not None and defer():
        return finish_last
    finish_last()
    return None


def reduce_scatter_pipelined(inp: torch.Tensor, out: torch.Tensor, hosts: list[list[int]], segment_numel: int,
                             reduce_scatter, cross_start, cross_finish):
    """out (1D c) gets block `group rank` of inp (1D world*c, blocks in group-rank order) reduced over the
    group: per segment of the blocks, a reduce-scatter inside the host for every host's blocks, then the
    ring across the hosts (of this local rank) on the host's partial sums, in the background.

    hosts: the group ranks of each host, in the cross rings' order (the same on every rank, equal sizes).
    segment_numel: elements of each block per segment. reduce_scatter(staged, part): part (1D s) gets
    this local rank's block of staged (1D L*s) reduced over the host. cross_start(parts, out_seg) starts
    the ring reduce-scatter of parts (1D H*s, host h's partials at row h) into out_seg, returns a handle;
    cross_finish(handle) waits (bounded). Link bytes per host and direction: (H-1)/H of inp, against
    (world-1)/world of it for the flat ring through one rank of the host.
    """
    H, L, c = len(hosts), len(hosts[0]), out.numel()
    order = torch.tensor([r for ranks in hosts for r in ranks])
    rows = inp.view(H * L, c)
    handles = []
    for a in range(0, c, segment_numel):
        b = min(c, a + segment_numel)
        staged = rows[:, a:b].index_select(0, order)  # (H*L, s): host-major; the one copy of inp
        parts = staged.new_empty(H, b - a)
        for h in range(H):
            reduce_scatter(staged[h * L:(h + 1) * L].view(-1), parts[h])
        handles.append(cross_start(parts.view(-1), out[a:b]))
    for handle in handles:
        cross_finish(handle)


def all_gather_pipelined(inp: torch.Tensor, out: torch.Tensor, hosts: list[list[int]], host_index: int,
                         segment_numel: int, all_gather, cross_start, cross_finish):
    """out (1D world*c, group-rank order) gets every rank's inp (1D c): per segment, the ring across the
    hosts (all segments posted at once), then an all-gather inside the host of each host's block as it
    lands (this host's own first, while the others are still on the link).

    hosts as in reduce_scatter_pipelined; host_index: this rank's host in it. all_gather(part, gathered):
    gathered (1D L*s) gets every local rank's part (1D s). cross_start(inp_seg, gathered): starts the ring
    all-gather of inp_seg into gathered (1D H*s, host h's at row h), returns a handle; cross_finish waits.
    """
    H, L, c = len(hosts), len(hosts[0]), inp.numel()
    rows = out.view(H * L, c)
    segments = [(a, min(c, a + segment_numel)) for a in range(0, c, segment_numel)]
    landed = [inp.new_empty(H, b - a) for a, b in segments]
    handles = [cross_start(inp[a:b], rows_h.view(-1)) for (a, b), rows_h in zip(segments, landed)]
    gathered = inp.new_empty(L * segment_numel)  # one host's rows of a segment, local-rank order

    def gather_host(h, a, b, part):
        # Each host's rows are placed as soon as they are gathered, so that after a segment lands only the
        # other hosts' rows remain to copy (the pipeline's exposed tail).
        g = gathered[:L * (b - a)].view(L, b - a)
        all_gather(part, g.view(-1))
        ranks = hosts[h]
        if ranks == list(range(ranks[0], ranks[0] + L)):  # the usual layout: a host's ranks in a row
            rows[ranks[0]:ranks[0] + L, a:b].copy_(g)
        else:
            rows[:, a:b].index_copy_(0, torch.tensor(ranks), g)

    for (a, b), rows_h, handle in zip(segments, landed, handles):
        gather_host(host_index, a, b, rows_h[host_index])
        cross_finish(handle)
        for h in range(H):
            if h != host_index:
                gather_host(h, a, b, rows_h[h])


def all_reduce_hierarchical(x: torch.Tensor, local_world: int, reduce_scatter, cross_all_reduce, all_gather):
    """Reduces the flat contiguous `x` in place over every rank of every host.

    x is padded with zeros to local_world equal blocks of c elements (staged, 1D local_world*c) when its
    numel does not divide. reduce_scatter(staged, part): part (1D c) gets block local_rank of staged
    reduced over the host; cross_all_reduce(part): part reduced in place across the hosts (the ring of
    this local rank); all_gather(part, gathered): every local rank's part into gathered (1D
    local_world*c), in local-rank order. Every rank of the group calls it with the same numel.
    """
    L = local_world
    c = -(-x.numel() // L)
    staged = x if x.numel() == L * c else torch.cat([x, x.new_zeros(L * c - x.numel())])
    part = torch.empty(c, dtype=x.dtype, device=x.device)
    reduce_scatter(staged, part)
    cross_all_reduce(part)
    gathered = x if staged is x else torch.empty_like(staged)
    all_gather(part, gathered)
    if gathered is not x:
        x.copy_(gathered[: x.numel()])


__all__ = ["all_reduce_hierarchical", "all_reduce_pipelined", "all_gather_pipelined", "reduce_scatter_pipelined"]
