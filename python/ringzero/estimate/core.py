"""estimate(): memory per GPU and communication per step of one training configuration, every term
kept in a dataclass so that tests and the training command can compare it with what they measure.
largest_model(): the biggest model of the same family that fits a GPU's memory.
"""
from __future__ import annotations

import dataclasses
import functools
import math

from .model import ACTIVATION_FORMULA, ModelShape, split_layers
from .moe import blocks_params, moe_block_params, routed_activation_bytes, routed_working_bytes
from .communication import collective_rows, collectives_of, stage_message_bytes
from .network import Cluster
from .plan import Plan, Precision


@dataclasses.dataclass
class StageMemory:
    """Bytes one GPU of one pipeline stage holds (every data-parallel rank of a stage holds the same)."""

    stage: int
    layers: int | None
    """Blocks on this stage (None when the model is given only as a parameter count)."""
    params: int
    """Parameters of this stage on one rank before ZeRO sharding (elements), its experts included."""
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    """Master copy and optimizer states, after ZeRO sharding."""
    activation_bytes: int | None
    """Kept for backward at the peak (all micro-batches in flight); None when not computable."""
    activation_terms: dict = dataclasses.field(default_factory=dict)
    """activation_bytes split by where it comes from."""
    transient_bytes: int = 0
    """Short-lived buffers at the peak: one recomputed block, ZeRO-3's gathered unit."""
    transient_terms: dict = dataclasses.field(default_factory=dict)
    expert_params: int = 0
    """Of `params`, the experts this rank holds (E / ep per MoE block); ZeRO shards them over plan.edp."""
    moe_blocks: int = 0
    """MoE blocks on this stage."""

    @property
    def model_state_bytes(self) -> int:
        """Parameters + gradients + optimizer (what the ZeRO paper's figures count)."""
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> int:
        return self.model_state_bytes + (self.activation_bytes or 0) + self.transient_bytes


@dataclasses.dataclass
class Estimate:
    """The result of estimate(). Byte properties refer to the fullest stage (`peak`)."""

    model: ModelShape | None
    n_params: int
    precision: Precision
    plan: Plan
    batch: int | None
    micro_batch: int | None
    stages: list
    collectives: list
    cluster: Cluster | None
    notes: list
    activation_formula: str = ACTIVATION_FORMULA

    @property
    def peak(self) -> StageMemory:
        return max(self.stages, key=lambda st: st.total_bytes)

    params_bytes = property(lambda self: self.peak.param_bytes)
    grads_bytes = property(lambda self: self.peak.grad_bytes)
    optimizer_bytes = property(lambda self: self.peak.optimizer_bytes)
    activation_bytes = property(lambda self: self.peak.activation_bytes)
    model_state_bytes = property(lambda self: self.peak.model_state_bytes)
    total_bytes = property(lambda self: self.peak.total_bytes)

    @property
    def sent_per_rank(self) -> float:
        return sum(c.sent_per_rank for c in self.collectives)

    @property
    def comm_time_s(self) -> float | None:
        """Sum over collectives of the fastest algorithm (no overlap with compute assumed)."""
        if self.cluster is None:
            return None
        return sum(c.times_s[c.best] for c in self.collectives if c.times_s)


def as_model(model) -> tuple[ModelShape | None, int]:
    """(shape or None, parameter count) from a ModelShape, a ringzero GPTConfig or a parameter count."""
    if isinstance(model, ModelShape):
        return model, model.n_params()
    if isinstance(model, bool) or model is None:
        raise TypeError(f"model must be a ModelShape, a GPTConfig or a parameter count, got {model!r}")
    if isinstance(model, (int, float)):
        if not (model >= 1 and float(model).is_integer()):
            raise ValueError(f"--params must be a whole number of parameters >= 1, got {model!r}")
        return None, int(model)
    if all(hasattr(model, k) for k in ("n_layer", "d_model", "n_head", "vocab_size", "seq_len")):
        shape = ModelShape.from_gpt_config(model)
        return shape, shape.n_params()
    raise TypeError(f"model must be a ModelShape, a GPTConfig or a parameter count, got {type(model).__name__}")


def _shard(count: int, ways: int) -> int:
    return -(-count // ways)  # ceil: a flat shard is padded to equal size on every rank


def _stage_params(shape: ModelShape | None, n_params: int, plan: Plan) -> tuple[list, list, list]:
    """(blocks per stage or Nones, parameters per stage and tensor-parallel rank, of which experts). The
    embedding sits on the first stage and the head on the last; a tied table is held by both when they
    differ (as Megatron does). A bare parameter count is divided evenly over stages and tensor-parallel
    ranks. A MoE model's rank holds E / ep experts of each MoE block on its stage."""
    pp, tp = plan.pp, plan.tp
    if shape is None:
        return [None] * pp, [_shard(n_params, pp * tp)] * pp, [0] * pp
    if plan.layers_per_stage is None:
        layers = split_layers(shape.n_layer, pp)
    else:
        layers = list(plan.layers_per_stage)
        if sum(layers) != shape.n_layer:
            raise ValueError(f"layers_per_stage={plan.layers_per_stage} places {sum(layers)} blocks; the model has "
                             f"{shape.n_layer}")
    starts = [sum(layers[:i]) for i in range(pp)]
    split = [_layer_bytes(shape, None, a, a + n, plan.ep, tp) for a, n in zip(starts, layers)]
    params = [replicated + experts for replicated, experts in split]
    params[0] += shape.embedding_params(tp)
    params[-1] += shape.head_params(tp)
    if shape.tied_embeddings and pp > 1:
        params[-1] += shape.vocab_rows(tp) * shape.d_model
    return layers, params, [experts for _, experts in split]


def _in_flight(plan: Plan, stage: int) -> int:
    """Micro-batches whose activations a stage holds at its peak."""
    if plan.pp == 1:
        return 1  # gradient accumulation runs micro-batches one after another
    if plan.schedule == "gpipe":
        return plan.microbatches
    flight = min(plan.microbatches, plan.pp - stage)
    if plan.schedule == "interleaved":  # the warm-up runs (pp - 1) / v more micro-batches' worth of chunks
        return min(plan.microbatches, math.ceil(flight * (1 + (plan.pp - 1) / (plan.pp * plan.virtual_stages))))
    return flight


def _micro_batch(batch: int | None, plan: Plan) -> int | None:
    if batch is None:
        return None
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"--batch must be a positive int (sequences per step, all ranks), got {batch!r}")
    per_step = plan.dp * plan.microbatches
    if batch % per_step:
        raise ValueError(f"--batch {batch} is not divisible by data-parallel ranks x micro-batches = {plan.dp} x "
                         f"{plan.microbatches}; use a multiple of {per_step}")
    return batch // per_step


def optimizer_bytes_per_param(precision: Precision, plan: Plan) -> int:
    """K of the ZeRO paper for this plan: master copy plus optimizer states, bytes per parameter.
    ZeRO-1/2 step a float32 master shard kept apart from the gathered weights even when the weights
    are float32 (ringzero's ZeroDataParallel, like DeepSpeed's fp32 partitions), so K includes it;
    ZeRO-3's master shard is the parameter shard itself, and DDP steps the parameters in place."""
    if plan.zero_stage in (1, 2) and precision.master_bytes == 0:
        return 4 + precision.optimizer_bytes
    return precision.optimizer_bytes


WORKING_TERM = "backward through one block (gradients in flight)"
RECOMPUTE_TERM = "one block recomputed ({})"


def _stage_memory(stage: int, layers, params: int, experts: int, moe_blocks: int, shape, micro,
                  precision: Precision, plan: Plan) -> StageMemory:
    z, dp = plan.zero_stage, plan.dp
    # ZeRO shards the replicated parameters over dp and the experts over the edp ranks holding the same ones.
    held = lambda stage_from: (_shard(params - experts, dp if z >= stage_from else 1)  # noqa: E731
                               + _shard(experts, plan.edp if z >= stage_from else 1))
    st = StageMemory(
        stage=stage, layers=layers, params=params,
        param_bytes=held(3) * precision.param_bytes,
        grad_bytes=held(2) * precision.grad_bytes,
        optimizer_bytes=held(1) * optimizer_bytes_per_param(precision, plan),
        activation_bytes=None, expert_params=experts, moe_blocks=moe_blocks)
    if z == 1 and (precision.grad_bytes != 4 or plan.microbatches > 1):
        # The optimizer steps the master shard with a float32 gradient. With float32 gradients and one
        # backward per step it is a view of the reduced buffer; with 16-bit gradients, or when later
        # micro-batches reuse the buffer, it is a copy, held across the step. The paper leaves it out.
        st.transient_terms["ZeRO-1 float32 gradient of the master shard"] = held(1) * 4
    if z >= 3 and plan.zeropp_options.hpz and plan.dp // plan.ranks_per_host > 1:
        st.transient_terms["ZeRO++ hpz secondary shard (parameters / ranks per host), kept from forward to the step"] = (
            _shard(params, plan.ranks_per_host) * precision.param_bytes)
    if z >= 3 and shape is not None:
        unit = max(shape.layer_params(plan.tp), shape.embedding_params(plan.tp), shape.head_params(plan.tp),
                   sum(moe_block_params(shape, plan.ep)) if shape.moe else 0)
        st.transient_terms["ZeRO-3 gathered units (the one in use and the prefetched next)"] = (
            2 * unit * precision.param_bytes)
    if shape is not None and micro is not None:
        _add_activations(st, stage, layers, shape, micro, precision, plan)
    if z == 2:
        # A bucket's gradients wait unsharded until the bucket is complete, then move to a flat buffer for
        # the reduce-scatter: twice the bucket at the end of a micro-batch's backward, when that
        # micro-batch's activations (not those of the others in flight) are freed, and so are the buffers
        # that live only while a block's backward runs (its gradients in flight, its recomputed
        # activations); counted only where that exceeds what the backward held before.
        bucket_end = 2 * min(plan.bucket_bytes, params * precision.grad_bytes)
        freed = (st.activation_bytes or 0) // _in_flight(plan, stage) + st.transient_terms.get(WORKING_TERM, 0) + \
            st.transient_terms.get(RECOMPUTE_TERM.format(plan.recompute), 0)
        st.transient_terms["ZeRO-2 bucket at the end of a backward, beyond the activations freed"] = max(
            0, bucket_end - freed)
    st.transient_bytes = sum(st.transient_terms.values())
    return st


@functools.lru_cache(maxsize=4096)
def _layer_bytes(shape: ModelShape, method: str | None, *args):
    """shape.method(*args) (None: blocks_params(shape, *args)), remembered: every stage of an estimate, and
    every layout of a search, asks the same few per-layer questions."""
    return blocks_params(shape, *args) if method is None else getattr(shape, method)(*args)


def _add_activations(st: StageMemory, stage: int, layers: int, shape, micro: int, precision: Precision,
                     plan: Plan):
    """Activations kept for backward, and the buffers that live beside them at backward's start."""
    e, flight, last = precision.act_bytes, _in_flight(plan, stage), plan.pp - 1
    tp, sp = plan.tp, plan.sequence_parallel
    terms = {f"{layers} blocks x {flight} micro-batches": layers * flight * _layer_bytes(
        shape, "layer_activation_bytes", micro, e, plan.recompute, tp, sp)}
    if st.moe_blocks:
        terms[f"{st.moe_blocks} of them MoE: routed tokens in place of the MLP (uniform routing)"] = (
            st.moe_blocks * flight * routed_activation_bytes(shape, micro, e, plan.recompute))
    if stage == 0:
        terms["embedding"] = flight * shape.embedding_activation_bytes(micro, tp, sp)
    if stage == last:
        terms["final norm, head and loss (float32 logits)"] = flight * shape.head_activation_bytes(micro, e, tp, sp)
    st.activation_terms, st.activation_bytes = terms, sum(terms.values())
    if plan.pp > 1:
        # ringzero's pipeline runtime waits for its sends at the end of the step: every message sent in
        # the step (a micro-batch's stage output forward, its input gradient backward) stays allocated.
        message = stage_message_bytes(shape, micro, e, plan)
        if stage < last:
            st.transient_terms["stage outputs sent forward, until the step's sends complete"] = plan.microbatches * message
        if stage > 0:
            st.transient_terms["input gradients sent back, until the step's sends complete"] = plan.microbatches * message
    if layers:
        st.transient_terms[WORKING_TERM] = _layer_bytes(shape, "backward_working_bytes", micro, e, tp, sp) + (
            max(0, routed_working_bytes(shape, micro, e) - shape.width * shape.seq_len * micro * e)
            if st.moe_blocks else 0)
    if plan.recompute != "none" and layers:
        st.transient_terms[RECOMPUTE_TERM.format(plan.recompute)] = _layer_bytes(
            shape, "layer_recompute_peak_bytes", micro, e, plan.recompute, tp, sp)


def estimate(model, batch: int | None = None, precision: Precision | None = None, plan: Plan | None = None,
             cluster: Cluster | None = None) -> Estimate:
    """Memory per GPU and communication per step.

    model: a ModelShape, a ringzero.models.GPTConfig (its exact shape) or a parameter count (then
    activations and pipeline traffic are not computed). batch: sequences per optimizer step over all
    ranks (None: no activations); each micro-batch has batch / (dp * microbatches) sequences.
    precision: bytes per parameter and activation (default float32 Adam). plan: strategy, world and
    pipeline sizes (default DDP on one rank). cluster: gives collective times (alpha-beta) and the
    GPU memory. Raises ValueError naming the argument when the combination is impossible.
    """
    shape, n_params = as_model(model)
    precision = precision or Precision()
    plan = plan or Plan()
    if shape is None and plan.pp > 1 and n_params < plan.pp:
        raise ValueError(f"--params {n_params} cannot be split over pp={plan.pp} stages")
    micro = _micro_batch(batch, plan)
    if shape is not None:
        shape.check_tp(plan.tp)
    if shape is not None and shape.moe is not None:
        shape.moe.check_layout(plan.ep, plan.tp, plan.zeropp)
    elif plan.ep > 1:
        raise ValueError(f"ep={plan.ep} needs a mixture-of-experts model (e.g. --model mixtral-8x7b)")
    if shape is not None and plan.virtual_stages > 1 and shape.n_layer < plan.pp * plan.virtual_stages:
        raise ValueError(f"{shape.n_layer} layers do not fill pp x virtual stages = {plan.pp} x {plan.virtual_stages} "
                         "chunks of at least one block; use fewer stages or chunks")
    layers, stage_params, stage_experts = _stage_params(shape, n_params, plan)
    starts = [sum(layers[:i]) for i in range(plan.pp)] if shape is not None else [0] * plan.pp
    moe_blocks = [shape.moe.count(a, a + n) if shape is not None and shape.moe else 0 for a, n in zip(starts, layers)]
    stages = [_stage_memory(i, layers[i], stage_params[i], stage_experts[i], moe_blocks[i], shape, micro, precision,
                            plan) for i in range(plan.pp)]
    rows, notes = collective_rows(shape, layers, stages, micro, precision, plan)
    collectives = collectives_of(rows, plan, cluster)
    if shape is None:
        notes.append("activations not computed: give the model shape (--layers --hidden --heads --vocab --seq)")
    elif micro is None:
        notes.append("activations not computed: give --batch")
    return Estimate(shape, n_params, precision, plan, batch, micro, stages, collectives, cluster, notes)


def largest_model(model, batch: int | None, precision: Precision, plan: Plan, capacity_bytes: int):
    """The largest model of the same family whose fullest stage fits capacity_bytes: with a shape,
    the most layers at the same width (returns (ModelShape, Estimate)); with a parameter count, the
    most parameters for model states alone (returns (count, Estimate)). None if nothing fits."""
    shape, _ = as_model(model)
    if shape is None:
        make, low, high = (lambda k: k), max(1, plan.pp), 2**50
    else:
        make, low, high = (lambda k: dataclasses.replace(shape, n_layer=k)), plan.pp * plan.virtual_stages, 2**20
    fits = lambda k: estimate(make(k), batch, precision, plan).total_bytes <= capacity_bytes  # noqa: E731
    if not fits(low):
        return None
    while low < high:  # invariant: low fits; memory grows with the size, so bisect
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return make(low), estimate(make(low), batch, precision, plan)
