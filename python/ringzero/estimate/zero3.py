"""ZeRO-3's communication rows for the estimate: the units ringzero's ZeroDataParallel gathers (a block each,
and the root group), and their ZeRO++ forms across hosts. Rows are (what, op, group, nbytes, calls) as
communication.collective_rows collects them."""
from __future__ import annotations

from .moe import blocks_params
from .plan import Plan, Precision


def zero3_units(shape, params: int, tp: int = 1) -> tuple[tuple[int, int], int]:
    """ZeRO-3's units as ringzero's ZeroDataParallel forms them for `ringzero train` (parallel/data_parallel/
    zero_units.py; a unit per block): ((how many blocks, parameters of each), the root group's parameters,
    the embedding, the final norm and the head, which is gathered once per forward and kept until the end of
    its backward, and never has an hpz secondary). Without a shape: one unit of every parameter, gathered for
    the forward and again for the backward, and no root. `params` are the replicated ones (a MoE model's
    experts are gathered over their own group, expert_parallel.py): a MoE model's blocks differ, so each
    counts as their mean (the bytes are exact, the root takes the remainder). With tp > 1 `params` and the
    units are one tensor-parallel rank's."""
    if shape is None:
        return (1, params), 0
    per_block = blocks_params(shape, 0, shape.n_layer, 1, tp)[0] // shape.n_layer
    return (shape.n_layer, per_block), params - shape.n_layer * per_block


def root_rows(root: int, m: int, precision: Precision) -> list:
    """The root group's rows (zero3_units): one all-gather and one reduce-scatter per micro-batch."""
    return [("root group all-gather, embedding and head", "all_gather", "dp",
             m * root * precision.param_bytes, m),
            ("root group gradients reduce-scatter", "reduce_scatter", "dp", m * root * precision.grad_bytes, m)]


def zeropp_rows(zpp, blocks: tuple[int, int], root: int, m: int, plan: Plan, precision: Precision,
                 notes: list) -> list:
    """ZeRO-3's rows with ZeRO++'s options across hosts (parallel/data_parallel/zeropp.py), for the units of
    zero3_units. Groups: 'dp' (all data-parallel ranks), 'dp-host' (a host's: L) and 'dp-cross' (one per
    host: H = dp / L). Block quantization adds a float32 scale per zpp.block values."""
    L, H = plan.ranks_per_host, plan.dp // plan.ranks_per_host
    n, per_block = blocks
    units = n + (1 if root else 0)
    params = n * per_block + root
    block_weights = n * per_block * precision.param_bytes
    rows = []
    # Gathers from the masters: the blocks' first forward of each step (every gather without hpz), and the
    # root's one gather per forward.
    from_masters = m if zpp.hpz else 2 * m
    gathered = from_masters * n * per_block + m * root  # parameters gathered from the masters per step
    gathers = from_masters * n + (m if root else 0)
    if zpp.qw:  # across hosts (H shards per call), then in the host (all dp shards)
        q8 = gathered * (1 + 4 / zpp.block)  # int8 values and their scales
        rows.append(("weights all-gather, int8 (qw), across hosts", "all_gather", "dp-cross", q8 * H / plan.dp, gathers))
        rows.append(("weights all-gather, int8 (qw), in the host", "all_gather", "dp-host", q8, gathers))
    else:
        rows.append(("parameters all-gather from the masters", "all_gather", "dp", from_masters * block_weights,
                     from_masters * n))
        if root:
            rows.append(root_rows(root, m, precision)[0])
    if zpp.hpz:  # every other gather of the step reads the in-host secondary shard
        rows.append(("weights all-gather from the secondary (hpz)", "all_gather", "dp-host",
                     (2 * m - from_masters) * block_weights, (2 * m - from_masters) * n))
    if zpp.qg_bits:  # reduce-scatter in the host (full precision), then an all-to-all of H quantized rows
        rows.append(("gradients reduce-scatter in the host (qg)", "reduce_scatter", "dp-host",
                     m * params * precision.grad_bytes, m * units))
        per_row = params / plan.dp * (zpp.qg_bits / 8 + 4 / zpp.block)
        rows.append((f"gradients all-to-all, int{zpp.qg_bits} (qg), across hosts", "all_to_all", "dp-cross",
                     m * H * per_row, m * units))
    else:
        rows.append(("gradients reduce-scatter", "reduce_scatter", "dp", m * n * per_block * precision.grad_bytes,
                     m * n))
        if root:
            rows.append(root_rows(root, m, precision)[1])
    notes.append(f"ZeRO++ {zpp.names()}: {H} hosts x {L} ranks; block padding and the float32 scales of partial "
                 "blocks are not counted")
    return rows
