"""Expert parallelism's communication per step, as the estimate's (what, op, group, nbytes, calls) rows.

Each MoE block exchanges its routed tokens over the ep group by all-to-all (ringzero.parallel.expert, as
DeepSpeed-MoE and Megatron run it): the routing counts (E int64 per rank) and the dispatch of the copies
to their experts' ranks in forward, the combine bringing the outputs back; in backward the combine's and
the dispatch's gradients travel the same way in reverse. So 4 all-to-alls of each rank's tokens x top_k
copies x d_model activations per MoE block and micro-batch (6 with full recomputation, which runs each
block's forward again), the buffer being the same on every rank under uniform routing.

The experts' gradients are reduced over 'edp', the dp / ep ranks holding the same experts (ZeRO shards the
experts' state over them); the replicated parameters' rows over 'dp' are communication.collective_rows'.
"""
from __future__ import annotations

import math

COUNT_BYTES = 8
"""One int64 count per expert in the routing-count exchange."""


def dispatch_rows(shape, moe_blocks: int, micro: int | None, act_bytes: int, plan, notes: list) -> list:
    """The all-to-all rows of the stage's `moe_blocks` MoE blocks over 'ep' (none with ep = 1: every expert
    is local). A note instead without the batch."""
    if shape is None or shape.moe is None or plan.ep == 1 or not moe_blocks:
        return []
    if micro is None:
        notes.append("expert-parallel all-to-alls not counted (give --batch)")
        return []
    passes = 2 if plan.recompute == "full" else 1  # forward runs per micro-batch
    per_call = micro * shape.seq_len * shape.moe.top_k * shape.d_model * act_bytes
    exchanges = moe_blocks * plan.microbatches * (passes + 1)  # each direction: forward(s) and one backward
    forwards = moe_blocks * plan.microbatches * passes
    notes.append("MoE all-to-alls under uniform routing (every rank sends and receives tokens x top_k copies; "
                 "imbalance moves more from some ranks)")
    return [("MoE dispatch all-to-all (and its gradient)", "all_to_all", "ep", exchanges * per_call, exchanges),
            ("MoE combine all-to-all (and its gradient)", "all_to_all", "ep", exchanges * per_call, exchanges),
            ("MoE routing counts all-to-all", "all_to_all", "ep", forwards * shape.moe.experts * COUNT_BYTES,
             forwards)]


def expert_gradient_rows(expert_params: int, moe_blocks: int, precision, plan) -> list:
    """The experts' rows over 'edp' for a stage holding `expert_params` expert parameters (E / ep per MoE
    block), by ZeRO stage as communication.collective_rows does the replicated ones: DDP all-reduces them; ZeRO-1/2
    reduce-scatter the gradients (ZeRO-2 after every micro-batch) and all-gather the parameters; ZeRO-3
    gathers each MoE block's experts in forward and backward and reduce-scatters their gradients."""
    if plan.edp == 1 or not expert_params:
        return []
    z, m = plan.zero_stage, plan.microbatches
    grads, weights = expert_params * precision.grad_bytes, expert_params * precision.param_bytes
    buckets = lambda nbytes: max(1, math.ceil(nbytes / plan.bucket_bytes))  # noqa: E731
    if z == 0:
        return [("expert gradients all-reduce", "all_reduce", "edp", grads, buckets(grads))]
    if z in (1, 2):
        times = m if z == 2 else 1
        return [("expert gradients reduce-scatter", "reduce_scatter", "edp", times * grads, times * buckets(grads)),
                ("expert parameters all-gather", "all_gather", "edp", weights, buckets(weights))]
    calls = m * moe_blocks
    return [("expert parameters all-gather, forward", "all_gather", "edp", m * weights, calls),
            ("expert parameters all-gather, backward", "all_gather", "edp", m * weights, calls),
            ("expert gradients reduce-scatter", "reduce_scatter", "edp", m * grads, calls)]


def expert_groups(plan, rank) -> dict[str, list]:
    """Every 'ep' and 'edp' group as lists of global ranks, with rank(stage, dp_index, tp_index) the mesh's
    rank formula and dp_index = edp_index * ep + ep_index (parallel.Mesh: an ep group is ep neighbours)."""
    ep, edp = plan.ep, plan.edp
    where = [(s, t) for s in range(plan.pp) for t in range(plan.tp)]
    return {"ep": [[rank(s, j * ep + i, t) for i in range(ep)] for s, t in where for j in range(edp)],
            "edp": [[rank(s, j * ep + i, t) for j in range(edp)] for s, t in where for i in range(ep)]}
