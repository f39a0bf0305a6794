"""The communication of one training configuration per step, seen from its fullest rank: which collectives
a plan's strategy, pipeline, tensor and expert parallelism call, on which group, with how many bytes and
calls (collective_rows), timed on a cluster's links (collectives_of), and what crosses between hosts
(cross_host_bytes). core.estimate() puts them in its Estimate.
"""
from __future__ import annotations

import dataclasses
import math

from .expert_parallel import dispatch_rows, expert_gradient_rows
from .network import Cluster, collective_times, sent_per_rank
from .placement import worst_group
from .plan import Plan, Precision
from .tensor_parallel import tensor_parallel_rows
from .zero3 import root_rows, zero3_units, zeropp_rows


@dataclasses.dataclass
class Collective:
    """One kind of communication in a step, seen from one rank."""

    what: str
    op: str
    """all_reduce, reduce_scatter, all_gather or send_recv."""
    group: str
    """'dp' (the data-parallel ranks of a stage), 'pp' (neighbouring stages) or 'tp' (the tensor-parallel
    ranks of a replica)."""
    group_size: int
    nbytes: int
    """Buffer bytes per step summed over calls (nccl-tests' size convention)."""
    calls: int
    """How many calls carry it (buckets, ZeRO-3 units, micro-batches); latency is paid per call."""
    sent_per_rank: float
    """Bytes this rank sends per step with the ring (bandwidth-optimal) algorithm."""
    times_s: dict | None = None
    """Seconds per step by algorithm (alpha-beta), when a cluster was given."""

    @property
    def best(self) -> str | None:
        return min(self.times_s, key=self.times_s.get) if self.times_s else None


def stage_message_bytes(shape, micro: int, act_bytes: int, plan: Plan) -> int:
    """One micro-batch's activations between pipeline stages, per rank: its sequence shard with sequence
    parallelism (as Megatron sends them), else the whole sbh tensor."""
    return micro * shape.seq_len * shape.d_model * act_bytes // (plan.tp if plan.sequence_parallel else 1)


def collective_rows(shape, layers, stages: list, micro, precision: Precision, plan: Plan) -> tuple[list, list]:
    """Per-step communication of the fullest stage as (collective, op, group, nbytes, calls) rows: its
    replicated parameters over dp, and the experts' rows (expert_parallel.py) of the stage holding the most."""
    notes, rows = [], []
    fullest = max(stages, key=lambda st: st.params)
    params, m, z = fullest.params - fullest.expert_params, plan.microbatches, plan.zero_stage
    grads, weights = params * precision.grad_bytes, params * precision.param_bytes
    buckets = lambda nbytes: max(1, math.ceil(nbytes / plan.bucket_bytes))  # noqa: E731
    if plan.dp > 1:
        if z == 0:
            rows.append(("gradients all-reduce", "all_reduce", "dp", grads, buckets(grads)))
        elif z in (1, 2):
            # ZeRO-2 keeps only its gradient shard, so it reduce-scatters after every micro-batch.
            times = m if z == 2 else 1
            rows.append(("gradients reduce-scatter", "reduce_scatter", "dp", times * grads, times * buckets(grads)))
            rows.append(("parameters all-gather", "all_gather", "dp", weights, buckets(weights)))
            if z == 2 and m > 1:
                notes.append(f"ZeRO-2: gradients reduce-scattered after each of the {m} micro-batches")
        else:
            if shape is None:
                notes.append("ZeRO-3 without layer shapes: one gather per pass counted (latency understated)")
            blocks, root = zero3_units(shape, params, plan.tp)
            zpp = plan.zeropp_options
            hosts = plan.dp // plan.ranks_per_host if zpp.any else 1
            if hosts > 1:
                rows += zeropp_rows(zpp, blocks, root, m, plan, precision, notes)
            else:
                n, p = blocks
                rows.append(("parameters all-gather, forward", "all_gather", "dp", m * n * p * precision.param_bytes,
                             m * n))
                rows.append(("parameters all-gather, backward", "all_gather", "dp", m * n * p * precision.param_bytes,
                             m * n))
                rows.append(("gradients reduce-scatter", "reduce_scatter", "dp", m * n * p * precision.grad_bytes,
                             m * n))
                if root:
                    rows += root_rows(root, m, precision)
    if plan.pp > 1:
        if shape is None or micro is None:
            notes.append("pipeline activations between stages not counted (give the model shape and --batch)")
        else:
            per_message = stage_message_bytes(shape, micro, precision.act_bytes, plan)
            # A middle stage sends each micro-batch's activations forward and its gradient backward.
            rows.append(("activations and their gradients between stages", "send_recv", "pp", 2 * m * per_message,
                         2 * m))
    if plan.tp > 1:
        rows += tensor_parallel_rows(shape, layers, micro, precision.act_bytes, plan, notes)
    moe = max(stages, key=lambda st: (st.moe_blocks, st.expert_params))
    rows += dispatch_rows(shape, moe.moe_blocks, micro, precision.act_bytes, plan, notes)
    rows += expert_gradient_rows(moe.expert_params, moe.moe_blocks, precision, plan)
    return rows, notes


def collectives_of(rows: list, plan: Plan, cluster: Cluster | None) -> list[Collective]:
    """The Collectives of collective_rows' (what, op, group, nbytes, calls) rows, each on its group's size,
    timed on `cluster`'s links by every algorithm that applies (None: not timed)."""
    collectives = []
    for what, op, group, nbytes, calls in rows:
        L = plan.ranks_per_host or plan.dp
        size = {"dp": plan.dp, "pp": plan.pp, "tp": plan.tp, "dp-host": L, "dp-cross": plan.dp // L, "ep": plan.ep,
                "edp": plan.edp}[group]
        c = Collective(what, op, group, size, nbytes, calls, sent_per_rank(op, nbytes, size))
        if cluster is not None:
            c.times_s = {algo: calls * t for algo, t in
                         collective_times(op, nbytes / calls, worst_group(group, plan, cluster), cluster).items()}
        collectives.append(c)
    return collectives


def cross_host_bytes(e) -> float | None:
    """Bytes each host sends to the others per step (payload, without frame headers), for data-parallel
    training with plan.ranks_per_host ranks per host on ringzero's CPU transports (comm/transports.py,
    Hierarchical): the 'dp' all-reduces hierarchical (2(H-1)/H of the buffer per host), the 'dp' all-gathers
    and reduce-scatters hierarchical ((H-1)/H) where a call's buffer is cut in two pipeline segments or more
    (2 MiB and up: transports.block_segment_numel), else on the flat ring over all dp ranks, ordered host by
    host, whose one link out of each host carries (dp-1)/dp of the buffer; the 'dp-cross' ones ring or
    pairwise (each of the host's L ranks sends its share), 'dp-host' none. None without ranks_per_host or
    with pipeline, tensor or expert parallelism (their groups are not counted here)."""
    from ..comm.transports import block_segment_numel

    plan = e.plan
    L = plan.ranks_per_host
    if not L or plan.pp > 1 or plan.tp > 1 or any(c.group in ("ep", "edp") for c in e.collectives):
        return None
    H, W = plan.dp // L, plan.dp
    total = 0.0
    for c in e.collectives:
        if c.group == "dp":
            if c.op == "all_reduce":
                total += 2 * (H - 1) / H * c.nbytes
            elif H > 1 and L > 1 and not block_segment_numel(int(c.nbytes / c.calls), 1, W):
                total += (W - 1) / W * c.nbytes
            else:
                total += (H - 1) / H * c.nbytes
        elif c.group == "dp-cross":
            total += L * c.sent_per_rank
    return total
