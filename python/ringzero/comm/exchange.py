"""The block movers of a group that spans hosts: all-to-all (even and uneven), gather and scatter over a
ring's point-to-point (ring.P2PRing.exchange), each byte crossing the link once; with several ranks on
every host, the blocks between a host's own ranks go through shared memory meanwhile.

[Note: the all-to-all across hosts] Every pair on two hosts exchanges its blocks directly. Grouping a
rank's blocks by destination host into one message to its counterpart there, which forwards them
through shared memory (DeepEP's forwarding), sends the same bytes in H-1 messages per rank instead of
(H-1)*L; in the lab (2 hosts x 2 ranks, 1 Gbit/s, 16 MiB per rank, five interleaved repeats) it took
177-191 ms against 149-159 for the direct exchange and 152-238 for gloo's (link bound 134 ms): fewer
TCP streams fill the shaped link worse (benchmarks/RESULTS.md, "All-to-all across the lab's hosts").

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
    return checked_count_matrix(ring.all_gather, ring.n, ring._label, send_counts, recv_counts, rank)


def checked_count_matrix(all_gather, n: int, label: str, send_counts: list[int], recv_counts: list[int],
                         rank: int) -> list[list[int]]:
    """count_matrix over any all-gather: all_gather(mine, table) fills the int64 CPU tensor `table` with
    every rank's `mine` in group-rank order (every rank of the group calls it)."""
    mine = torch.tensor(list(send_counts) + list(recv_counts), dtype=torch.int64)
    table = torch.empty(n * 2 * n, dtype=torch.int64)
    all_gather(mine, table)
    rows = table.view(n, 2 * n).tolist()
    for q in range(n):
        for p in range(n):
            if rows[q][p] != rows[p][n + q]:
                raise CollectiveMismatch(
                    f"ringzero {label} on group rank {rank}: the ranks' split sizes disagree: group rank {q} "
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


def gather_flat(ring, outs: list, inp: torch.Tensor, root: int, rank: int):
    """The root receives every rank's block straight from it into outs[rank] (flat contiguous tensors, the
    root's only: a flat output's views or the caller's own list, so nothing is copied after)."""
    if rank != root:
        ring.exchange([(root, inp)], [])
        return
    outs[root].copy_(inp)
    ring.exchange([], [(q, outs[q]) for q in range(ring.n) if q != root])


def scatter_flat(ring, out: torch.Tensor, ins: list, root: int, rank: int):
    """The root sends each rank its block, ins[rank], straight (flat contiguous tensors, the root's only)."""
    if rank != root:
        ring.exchange([], [(root, out)])
        return
    out.copy_(ins[root])
    ring.exchange([(q, ins[q]) for q in range(ring.n) if q != root], [])


def all_to_all_direct_across(ring, shm, hosts: list[list[int]], out: torch.Tensor, inp: torch.Tensor,
                             send_counts: list[int], recv_counts: list[int], rank: int):
    """Several hosts of L ranks each: every pair on two hosts exchanges its blocks directly over the link
    (each byte crosses once, (H-1)*L messages per rank), while one shared-memory all-to-all moves the blocks
    between the ranks of each host, written straight into `out` where the host's ranks are consecutive."""
    matrix = count_matrix(ring, send_counts, recv_counts, rank)
    h = next(i for i, ranks in enumerate(hosts) if rank in ranks)
    mine = hosts[h]
    sd, rd = _displacements(send_counts), _displacements(recv_counts)
    away = [g for h2, ranks in enumerate(hosts) if h2 != h for g in ranks]
    try:
        posted = ring.exchange_start([(g, inp[sd[g]:sd[g] + send_counts[g]]) for g in away],
                                     [(g, out[rd[g]:rd[g] + recv_counts[g]]) for g in away])
    except BaseException as e:
        shm.abort(f"its cross-host step failed: {e}")
        raise
    own_send, own_recv = [matrix[rank][g] for g in mine], [matrix[g][rank] for g in mine]
    consecutive = mine == list(range(mine[0], mine[0] + len(mine)))
    src = inp[sd[mine[0]]:sd[mine[-1]] + send_counts[mine[-1]]] if consecutive else \
        torch.cat([inp[sd[g]:sd[g] + send_counts[g]] for g in mine])
    dst = out[rd[mine[0]]:rd[mine[-1]] + recv_counts[mine[-1]]] if consecutive else \
        torch.empty(sum(own_recv), dtype=inp.dtype)
    shm.all_to_all_v(src, dst, own_send, own_recv)
    if not consecutive:
        off = 0
        for g, k in zip(mine, own_recv):
            out[rd[g]:rd[g] + k].copy_(dst[off:off + k])
            off += k
    try:
        ring.exchange_finish(posted)
    except BaseException as e:
        shm.abort(f"its cross-host step failed: {e}")
        raise


__all__ = ["all_to_all_direct_across", "all_to_all_flat", "checked_count_matrix", "count_matrix", "gather_flat", "scatter_flat"]
