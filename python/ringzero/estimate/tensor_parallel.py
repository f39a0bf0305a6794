"""Megatron's tensor-parallel communication per step (Shoeybi et al. 2019), and its sequence-parallel form
(Korthikanti et al. 2022, section 4.2.2), as the estimate's (what, op, group, nbytes, calls) rows.

Each block has two conjugate pairs (f, g), one around attention and one around the MLP: g all-reduces
the row-split layer's partial sbh output in forward, f all-reduces the input gradient in backward; so 2
all-reduces forward and 2 backward of sbh elements per block and micro-batch. With sequence parallelism
g becomes a reduce-scatter and f an all-gather in forward, and their conjugates the other way round in
backward: 4 of each, together the same bytes as the 4 all-reduces (an all-reduce is a reduce-scatter then
an all-gather). The column-split layers' inputs, stored as sequence shards, are all-gathered once more in
backward for the weight gradients (2 per block). Full recomputation runs each block's forward, and so
its 2 forward collectives, again (and then gathers the inputs anyway). The embedding and the
vocabulary-parallel head add one sbh collective each way, and cross-entropy three all-reduces of sb
float32 statistics (max, sum of exponentials, target logit).
"""
from __future__ import annotations

CROSS_ENTROPY_STATS = 3
"""All-reduces of sb float32 values in vocabulary-parallel cross-entropy: max, sum of exponentials, target logit."""


def tensor_parallel_rows(shape, layers: list, micro: int | None, act_bytes: int, plan, notes: list) -> list:
    """Rows for the stage with the most blocks (its embedding and head only when pp == 1; with pp > 1 a
    note says they are left out). Nothing, with a note, without the model shape or the batch."""
    if shape is None or micro is None:
        notes.append("tensor-parallel communication not counted (give the model shape and --batch)")
        return []
    m, sp = plan.microbatches, plan.sequence_parallel
    sbh_bytes = micro * shape.seq_len * shape.d_model * act_bytes
    per_block = 4 + (2 if plan.recompute == "full" else 0)  # each kind, per block and micro-batch
    block_calls = max(layers) * m * per_block
    kinds = ("reduce_scatter", "all_gather") if sp else ("all_reduce",)
    rows = [(f"tensor-parallel {op.replace('_', '-')}, blocks", op, "tp", block_calls * sbh_bytes, block_calls)
            for op in kinds]
    if sp and plan.recompute != "full":
        again = max(layers) * m * 2
        rows.append(("tensor-parallel re-gather for weight gradients", "all_gather", "tp", again * sbh_bytes, again))
    if plan.pp > 1:
        notes.append("tensor parallel: the embedding's and head's collectives are left out with pp > 1")
        return rows
    rows += [("tensor-parallel, embedding and head", op, "tp", 2 * m * sbh_bytes, 2 * m) for op in kinds]
    stats = CROSS_ENTROPY_STATS * m
    rows.append(("tensor-parallel cross-entropy statistics", "all_reduce", "tp", stats * micro * shape.seq_len * 4,
                 stats))
    return rows
