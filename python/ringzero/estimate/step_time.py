"""How long one training step takes: the compute of every stage from the model's FLOPs and memory traffic
(flops.py) at the GPU kind's achieved rates (gpus.py), the pipeline's bubble for its schedule, and the
collectives of the Estimate (communication.py, timed on the cluster's links by network.py) less what overlaps
compute, stated per term.

    step = m x slowest stage's micro-batch + bubble + exposed data-parallel traffic + optimizer step

A stage's micro-batch is its forward and backward (and recomputation) plus the exposed share of its
tensor-parallel, expert-parallel and pipeline messages. For a line of stages with times t_i the m
micro-batches finish after m max(t) + (sum(t) - max(t)) (1F1B and GPipe: a flow shop of equal jobs); the
interleaved schedule divides the second term by v (Narayanan et al. 2021), ZB-H1 by 3 (Qi et al. 2023: its
bubble is (p-1)(T_F + T_B - T_W) against 1F1B's (p-1)(T_F + T_B + T_W), with T_F = T_B = T_W).
"""
from __future__ import annotations

import dataclasses
from . import flops
from .core import Estimate, optimizer_bytes_per_param
from .gpus import GpuKind

BUBBLE_SHARE = {"1f1b": 1.0, "gpipe": 1.0, "zb-h1": 1.0 / 3}
"""The pipeline's warm-up and drain, as a share of one pass of a micro-batch through the other stages
(the interleaved schedule: 1 / virtual_stages)."""
PER_MICRO_GROUPS = ("tp", "ep", "pp")
"""Collectives that run inside each micro-batch's forward and backward (and so also in the bubble)."""


def _fraction(name: str, v) -> float:
    if not (isinstance(v, (int, float)) and 0 <= v <= 1):
        raise ValueError(f"overlap {name} must be a fraction in [0, 1], got {v!r}")
    return float(v)


@dataclasses.dataclass(frozen=True)
class Overlap:
    """The share of each kind of communication hidden behind compute (0: fully on the critical path)."""

    dp: float = 0.0
    """Gradient reduction and ZeRO's gathers over the data-parallel ranks. 0: they run after the last
    micro-batch's backward, as Megatron-LM 2021 and DeepSpeed's pipeline engine do; a bucketed reduction
    that starts during the backward (torch DDP, Megatron's overlap_grad_reduce) hides up to all of it."""
    tp: float = 0.0
    """Tensor-parallel all-reduces (or reduce-scatters and all-gathers): each blocks the next GEMM."""
    pp: float = 0.0
    """Activations and gradients between pipeline stages: on the critical path of 1F1B's steady state."""
    ep: float = 0.0
    """Expert-parallel all-to-alls: the next expert GEMM waits for its tokens."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            _fraction(f.name, getattr(self, f.name))

    def of(self, group: str) -> float:
        """The overlap of a collective's group ('dp', 'edp', 'dp-host' and 'dp-cross' are data parallel)."""
        return getattr(self, group) if group in ("tp", "pp", "ep") else self.dp


@dataclasses.dataclass
class Term:
    """One line of the breakdown: seconds per step on the critical path, and what was hidden."""

    name: str
    seconds: float
    """On the critical path (after overlap)."""
    hidden_s: float = 0.0
    """Overlapped with compute, so not counted in the step."""
    note: str = ""


@dataclasses.dataclass
class StepTime:
    """The result of step_time(): one optimizer step of the Estimate's plan on a GPU kind."""

    step_s: float
    terms: list
    """Term rows; their seconds add up to step_s."""
    tokens_per_step: int
    world: int
    model_flops: float
    """FLOPs of the step without recomputation (forward + backward), all GPUs together: MFU's numerator."""
    hardware_flops: float
    """FLOPs the GPUs execute, recomputation included (Megatron-LM's and BLOOM's TFLOP/s count these)."""
    gpu: GpuKind
    stage_micro_s: list
    """One micro-batch's forward and backward on each pipeline stage, exposed messages included."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s

    @property
    def tflops_per_gpu(self) -> float:
        """Model FLOPs per second per GPU, in TFLOP/s (recomputation not counted)."""
        return self.model_flops / self.step_s / self.world / 1e12

    @property
    def hardware_tflops_per_gpu(self) -> float:
        """Executed FLOPs per second per GPU, in TFLOP/s (recomputation counted)."""
        return self.hardware_flops / self.step_s / self.world / 1e12

    @property
    def mfu(self) -> float:
        """Model FLOPs utilization: model FLOPs per second over the GPUs' dense 16-bit peak."""
        return self.model_flops / self.step_s / self.world / self.gpu.peak_flops_per_s

    def as_dict(self) -> dict:
        """Plain numbers for `--json`."""
        return {"step_s": self.step_s, "tokens_per_s": self.tokens_per_s, "tflops_per_gpu": self.tflops_per_gpu,
                "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu, "mfu": self.mfu, "gpu": self.gpu.name,
                "terms": [dataclasses.asdict(t) for t in self.terms], "stage_micro_s": self.stage_micro_s}


def _stage_compute_s(est: Estimate, stage: int, first_block: int, gpu: GpuKind) -> float:
    """Forward, recomputation and backward of one micro-batch on one stage and tensor-parallel rank."""
    shape, plan = est.model, est.plan
    tokens, tp, sp = est.micro_batch * shape.seq_len, plan.tp, plan.sequence_parallel
    gemm_fwd, attn_fwd = flops.forward_passes(plan.recompute)
    back = flops.BACKWARD_PER_FORWARD
    width = min(shape.d_model, shape.q_dim / tp)  # the narrowest side of a block's GEMMs on one rank
    layers = est.stages[stage].layers
    # A dense model's blocks are alike: one block's time, times the blocks (a MoE model's, block by block).
    kinds = [(first_block, layers)] if shape.moe is None else [(b, 1) for b in range(first_block, first_block + layers)]
    seconds = 0.0
    for block, count in kinds:
        gemm = gpu.gemm_s(flops.block_gemm_flops(shape, tokens, tp, block), width)
        core = gpu.gemm_s(flops.attention_core_flops(shape, tokens, tp), shape.head_size)
        moved = gpu.memory_s(flops.block_elementwise_bytes(shape, tokens, est.precision.act_bytes, tp, sp, block))
        seconds += count * ((gemm + moved) * (gemm_fwd + back) + core * (attn_fwd + back))
    if stage == plan.pp - 1:
        seconds += gpu.gemm_s(flops.head_flops(shape, tokens, tp), shape.d_model) * (1 + back)
        seconds += gpu.memory_s(flops.head_elementwise_bytes(shape, tokens, tp))
    return seconds


def _optimizer_s(est: Estimate, gpu: GpuKind) -> float:
    """The optimizer step of the fullest rank: it reads and writes its optimizer state (master copy and
    moments), reads the gradients and writes the working parameters of the parameters it updates."""
    st, prec = est.peak, est.precision
    updated = st.optimizer_bytes / optimizer_bytes_per_param(prec, est.plan) if st.optimizer_bytes else 0
    return gpu.memory_s(2 * st.optimizer_bytes + updated * (prec.grad_bytes + prec.param_bytes))


def _accumulate_s(est: Estimate, gpu: GpuKind) -> float:
    """One micro-batch's gradients added into the step's gradient buffer on the fullest rank: read the
    buffer and the new gradient, write the sum, at the buffer's precision (Precision.grad_bytes)."""
    return gpu.memory_s(3 * est.peak.params * est.precision.grad_bytes)


def step_time(est: Estimate, gpu: GpuKind, overlap: Overlap | None = None) -> StepTime:
    """The step time of `est` (an Estimate with a model shape, a batch and a cluster) on GPUs of kind `gpu`.

    Every stage runs its own blocks, the last also the head (the embedding's lookup is left out: no GEMM);
    collectives take the fastest algorithm's time from the Estimate. ValueError when the Estimate lacks
    what is needed."""
    if est.model is None or est.micro_batch is None:
        raise ValueError("the step time needs the model's shape and --batch (not --params alone)")
    if est.cluster is None:
        raise ValueError("the step time needs a cluster (--cluster, or --intra-gbps/--inter-gbps/--latency-us)")
    overlap = overlap or Overlap()
    plan, shape = est.plan, est.model
    m = plan.microbatches
    per_micro, comm_terms = 0.0, []
    for c in est.collectives:
        seconds = c.times_s[c.best] if c.times_s else 0.0
        share = overlap.of(c.group)
        comm_terms.append(Term(f"{c.what} ({c.group} x{c.group_size}, {c.best})", seconds * (1 - share),
                               seconds * share, f"overlap {share:.0%}"))
        if c.group in PER_MICRO_GROUPS:
            per_micro += seconds * (1 - share) / m
    starts = [sum(st.layers for st in est.stages[:i]) for i in range(plan.pp)]
    compute = [_stage_compute_s(est, i, starts[i], gpu) for i in range(plan.pp)]
    stage_micro = [c + per_micro for c in compute]
    slowest = max(stage_micro)
    share = 1.0 / plan.virtual_stages if plan.schedule == "interleaved" else BUBBLE_SHARE[plan.schedule]
    bubble = (sum(stage_micro) - slowest) * share
    steady_compute = m * max(compute)
    terms = [Term("compute: forward, recomputation and backward", steady_compute, 0.0,
                  f"{m} micro-batches x the slowest stage's {max(compute) * 1e3:.2f} ms")]
    per_micro_terms = [t for t, c in zip(comm_terms, est.collectives) if c.group in PER_MICRO_GROUPS]
    step_terms = [t for t, c in zip(comm_terms, est.collectives) if c.group not in PER_MICRO_GROUPS]
    terms += per_micro_terms
    if plan.pp > 1:
        terms.append(Term(f"pipeline bubble ({plan.schedule}, {plan.pp} stages)", bubble, 0.0,
                          f"(sum of stages - slowest) x {share:.3g}"))
    terms += step_terms
    if m > 1:
        terms.append(Term("gradient accumulation (memory-bound)", (m - 1) * _accumulate_s(est, gpu), 0.0,
                          f"{m - 1} additions into the gradient buffer"))
    terms.append(Term("optimizer step (memory-bound)", _optimizer_s(est, gpu)))
    # m x slowest stage = the compute term plus the per-micro messages; a stage slower only by its
    # messages is not in this model (every stage sends the same messages).
    step = sum(t.seconds for t in terms)
    tokens = est.batch * shape.seq_len
    return StepTime(step_s=step, terms=terms, tokens_per_step=tokens, world=plan.world,
                    model_flops=flops.model_flops(shape, tokens, "none"),
                    hardware_flops=flops.model_flops(shape, tokens, plan.recompute), gpu=gpu,
                    stage_micro_s=stage_micro)

