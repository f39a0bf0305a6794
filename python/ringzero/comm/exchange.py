"""The block movers of a group that spans hosts: all-to-all (even and uneven), gather and scatter over a
ring's point-to-point (ring.P2PRing.exchange), and the hierarchical all-to-all that sends each byte across
the link once, grouped by destination host, and forwards it inside the host through shared memory.

Counts are elements of flat contiguous CPU tensors, as the shared-memory all_to_all_v takes them:
send_counts[p] of this rank's input go to group rank p (blocks in rank order), recv_counts[q] come from
group rank q (likewise). Every function is called by every rank of the group, in the same order.
"""
from __future__ import annotations

import torch

from .errors import CollectiveMismatch


def _displacements(counts: list[int]) -> list[int]:
    out, total = [], 0
    for c in counts:
        out.append(total)
        total += c
    return out


def count_matrix(ring, send_counts: list[int], recv_counts: list[int], rank: int) -> list[list[int]]:
    """Every rank's send counts, matrix[q][p] = what group rank q sends to group rank p, from one small
    all-gather over the flat `ring` (members in group-rank order) of every rank's send and receive counts.
    Every rank checks the whole matrix, so all raise the same CollectiveMismatch where two ranks' split
    sizes disagree (the counterpart of [Note: the all-to-all's count table], csrc/core/shm_alltoall.cpp)."""
    n = ring.n
    mine = torch.tensor(list(send_counts) + list(recv_counts), dtype=torch.int64)
    table = torch.empty(n * 2 * n, dtype=torch.int64)
    ring.all_gather(mine, table)
    rows = table.view(n, 2 * n).tolist()
    for q in range(n):
        for p in range(n):
            if rows[q][p] != rows[p][n + q]:
                raise CollectiveMismatch(
                    f"ringzero {ring._label} on group rank {rank}: the ranks' split sizes disagree: group rank {q} "
                    f"sends {rows[q][p]} elements to group rank {p}, which expects {rows[p][n + q]} from it (rank q's "
                    "input_split_sizes[p] must equal rank p's output_split_sizes[q])")
    return [row[:n] for row in rows]


def all_to_all_flat(ring, out: torch.Tensor, inp: torch.Tensor, send_counts: list[int], recv_counts: list[int],
                    rank: int):
    """Every pair exchanges its two blocks directly, all pairs at once: each byte crosses once."""
    count_matrix(ring, send_counts, recv_counts, rank)
    sd, rd = _displacements(send_counts), _displacements(recv_counts)
    out[rd[rank]:rd[rank] + recv_counts[rank]].copy_(inp[sd[rank]:sd[rank] + send_counts[rank]])
    others = [p for p in range(ring.n) if p != rank]
    ring.exchange([(p, inp[sd[p]:sd[p] + send_counts[p]]) for p in others],
                  [(p, out[rd[p]:rd[p] + recv_counts[p]]) for p in others])


def gather_flat(ring, out: torch.Tensor, inp: torch.Tensor, root: int, rank: int):
    """The root receives every rank's block straight from it; only root's out is written."""
    count = inp.numel()
    if rank != root:
        ring.exchange([(root, inp)], [])
        return
    out[root * count:(root + 1) * count].copy_(inp)
    ring.exchange([], [(q, out[q * count:(q + 1) * count]) for q in range(ring.n) if q != root])


def scatter_flat(ring, out: torch.Tensor, inp: torch.Tensor, root: int, rank: int):
    """The root sends each rank its block straight; only root's inp is read."""
    count = out.numel()
    if rank != root:
        ring.exchange([], [(root, out)])
        return
    out.copy_(inp[root * count:(root + 1) * count])
    ring.exchange([(q, inp[q * count:(q + 1) * count]) for q in range(ring.n) if q != root], [])


def all_to_all_hierarchical(ring, shm, hosts: list[list[int]], out: torch.Tensor, inp: torch.Tensor,
                            send_counts: list[int], recv_counts: list[int], rank: int):
    """Several hosts of L ranks each (`hosts`: each host's group ranks in local-rank order). Local rank l
    sends local rank l of every other host, in one message, all its blocks for that host's ranks (so each
    byte crosses the link once, grouped by destination host; H-1 messages per rank where the flat exchange
    sends (H-1)*L), and the receiver forwards them inside its host through shared memory:
      1. the cross-host messages are posted;
      2. while they travel, one shared-memory all-to-all moves this host's own blocks between its ranks;
      3. once they have landed, a second one hands each local rank the blocks that came across for it;
    each block then goes to its source's place in `out`. In the host: a packing copy where a host's ranks
    are not consecutive, the two shared-memory all-to-alls, one copy into place of what came across."""
    matrix = count_matrix(ring, send_counts, recv_counts, rank)
    h = next(i for i, ranks in enumerate(hosts) if rank in ranks)
    local, mine = hosts[h].index(rank), hosts[h]
    sd, rd = _displacements(send_counts), _displacements(recv_counts)
    block = lambda g: inp[sd[g]:sd[g] + send_counts[g]]  # noqa: E731  this rank's block for group rank g
    others = [h2 for h2 in range(len(hosts)) if h2 != h]

    def blocks_for(ranks):  # this rank's blocks for `ranks`, one tensor (a view where they are consecutive)
        if ranks == list(range(ranks[0], ranks[0] + len(ranks))):
            return inp[sd[ranks[0]]:sd[ranks[-1]] + send_counts[ranks[-1]]]
        return torch.cat([block(g) for g in ranks])

    # 1. Across hosts, with local rank `local` of each other host: what it holds for this host's ranks.
    came = {h2: torch.empty(sum(matrix[hosts[h2][local]][g] for g in mine), dtype=inp.dtype) for h2 in others}
    try:
        posted = ring.exchange_start([(hosts[h2][local], blocks_for(hosts[h2])) for h2 in others],
                                     [(hosts[h2][local], came[h2]) for h2 in others])
    except BaseException as e:
        shm.abort(f"its cross-host step failed: {e}")
        raise

    # 2. This host's own blocks, meanwhile: local rank l2 gets this rank's block for it, straight into `out`.
    own_send = [matrix[rank][g] for g in mine]
    own_recv = [matrix[g][rank] for g in mine]
    own_out = torch.empty(sum(own_recv), dtype=inp.dtype)
    shm.all_to_all_v(blocks_for(mine), own_out, own_send, own_recv)
    off = 0
    for g, k in zip(mine, own_recv):
        out[rd[g]:rd[g] + k].copy_(own_out[off:off + k])
        off += k

    try:
        ring.exchange_finish(posted)
    except BaseException as e:
        shm.abort(f"its cross-host step failed: {e}")  # the local ranks waiting for it fail at once, quoting it
        raise

    # 3. What came across, to its local rank: for local destination l2, the blocks from every other host's
    # local rank `local` (host order), each a piece of what that host sent.
    pieces, send_local = [], []
    for l2, dst in enumerate(mine):
        total = 0
        for h2 in others:
            src = hosts[h2][local]
            off = sum(matrix[src][mine[l3]] for l3 in range(l2))
            k = matrix[src][dst]
            pieces.append(came[h2][off:off + k])
            total += k
        send_local.append(total)
    recv_local = [sum(matrix[hosts[h2][l3]][rank] for h2 in others) for l3 in range(len(mine))]
    staged = torch.cat(pieces) if pieces else inp[:0]
    landed = torch.empty(sum(recv_local), dtype=inp.dtype)
    shm.all_to_all_v(staged, landed, send_local, recv_local)
    off = 0  # landed: per local source l3, the blocks of every other host's rank l3, in host order
    for l3 in range(len(mine)):
        for h2 in others:
            g = hosts[h2][l3]
            k = matrix[g][rank]
            out[rd[g]:rd[g] + k].copy_(landed[off:off + k])
            off += k


__all__ = ["all_to_all_flat", "all_to_all_hierarchical", "count_matrix", "gather_flat", "scatter_flat"]
