"""The estimator's prediction for a run, put beside what the run measured: the peak memory (the cross-check)
and, on CPU ranks, the step time (the step-time model on a CPU kind calibrated in the rank: estimate/cpu_kind.py)."""
from __future__ import annotations

from ..comm.config import from_env
from ..parallel.layout import STRATEGY_FORMS, StrategyForm, form_of
from .layout import BASELINE_LAYOUT, BASELINES, estimator_schedule, layout_of
from .models import model_family


def estimator_strategy(strategy: str) -> str:
    """The estimator's name for what a strategy does across its replicas: the one of the same pipeline and
    ZeRO stage without tensor or expert parallelism (tp -> ddp, 3d -> pp+zero1, ep+zero1 -> zero1). The
    estimator puts tp > 1 and ep > 1 under any strategy: Megatron's tensor parallelism inside every
    replica, the experts sharded over ep data-parallel ranks."""
    form = form_of(strategy)
    plain = StrategyForm(pipeline=form.pipeline, tensor_parallel=False, zero_stage=form.zero_stage)
    return next(name for name, f in STRATEGY_FORMS.items() if f == plain)


def _plan(args, run: str, world: int, layers_per_stage=None):
    """The estimator's Plan of this run's layout (a torch row: its ringzero counterpart's)."""
    from ..estimate import Plan

    layout = layout_of(run, world, args.pp, args.tp)
    return Plan(strategy=estimator_strategy(layout.strategy), world=world, pp=layout.pp,
                tp=layout.tp, sequence_parallel=bool(getattr(args, "sequence_parallel", False)) and layout.tp > 1,
                microbatches=args.microbatches if layout.pipeline else 1,
                schedule=estimator_schedule(args.schedule), recompute=getattr(args, "recompute", "none"),
                layers_per_stage=tuple(layers_per_stage) if layers_per_stage else None, ep=layout.ep)


def estimate_for_run(args, run: str, world: int, layers_per_stage=None) -> dict:
    """ringzero.estimate's prediction for this run (float32 AdamW, the same model, batch and layout; a
    torch row takes the layout of its ringzero counterpart, layout.BASELINE_LAYOUT): the fullest rank's
    total, each rank's total (rank r is stage r // dp) and the terms of the fullest. A tensor-parallel
    run is estimated with its tp degree and sequence parallelism; its ranks' stages are r // (dp * tp). An
    expert-parallel run (--model moe) with its ep degree (layout.ep: every rank).
    A model the estimator has no shape for (an hf model: models.HFFamily.estimate_model) is given as its
    parameter count, so its activations are not estimated; "estimate_note" says so (None otherwise)."""
    from ..estimate import estimate

    plan = _plan(args, run, world, layers_per_stage)
    model, note = model_family(args).estimate_model()
    e = estimate(model, batch=args.batch, plan=plan)
    mib = 2**20
    return {"estimate_mib_per_rank": e.total_bytes / mib, "estimate_note": note,
            "estimate_layout": BASELINE_LAYOUT.get(run, run),
            "estimate_mib_by_rank": [e.stages[r // (plan.dp * plan.tp)].total_bytes / mib for r in range(world)],
            "estimate_terms_mib": {"parameters": e.params_bytes / mib, "gradients": e.grads_bytes / mib,
                                   "optimizer": e.optimizer_bytes / mib,
                                   "activations": (e.activation_bytes or 0) / mib,
                                   "transient": e.peak.transient_bytes / mib}}


def _not_predicted(device: str, precision: str) -> str | None:
    """Why a run's step time is not predicted (predicted_step_for_run), or None."""
    if device != "cpu":
        return "the step-time model is calibrated for CPU ranks only"
    if precision != "fp32":
        return f"{precision} autocast on CPU is not modelled"
    if from_env().host_id:  # RINGZERO_HOST_ID: the host lab, or a test of the multi-host path on one machine
        return ("ranks on forced hosts (RINGZERO_HOST_ID); their link is not known here "
                "(estimate.cpu_kind.cpu_cluster takes it as link_gbps)")
    return None


def cpu_probe_for_run(args, run: str, world: int, device: str, precision: str):
    """A CpuProbe (estimate.cpu_kind) on this run's shapes for one rank: one micro-batch's tokens, the MLP's
    width and the heads over tp; None where the step time is not predicted (see predicted_step_for_run)."""
    from ..estimate.core import as_model
    from ..estimate.cpu_kind import CpuProbe

    shape = as_model(model_family(args).estimate_model()[0])[0]
    if _not_predicted(device, precision) or shape is None:
        return None
    plan = _plan(args, run, world)
    tokens = args.batch // (plan.dp * plan.microbatches) * shape.seq_len
    return CpuProbe(shape.d_model, shape.width // plan.tp, tokens, shape.head_size, shape.seq_len,
                    max(1, shape.n_head // plan.tp), shape.attention)


TIMED_OPS = ("all_reduce", "all_gather", "reduce_scatter")
"""The collectives timed_collectives measures on the torch rows' group (the others keep the link's model)."""


def timed_collectives(est, group=None, repeats: int | None = None):
    """`est` with the time of each data-parallel collective measured on `group` (None: the default group)
    through torch.distributed, as the torch rows call it: every call of the step at its mean size
    (nbytes / calls, float32), the median of `repeats` calls (CALIBRATION_REPEATS), each after a barrier so
    that it is the collective's own time. The torch rows run on gloo, whose time per byte depends on the
    op and the size (on the 2-core VM a 3 MiB all-gather took 3.3 ms and a reduce-scatter 7.6 ms, 13 MiB
    all-reduce 12.3 ms: benchmarks/RESULTS.md), where the model's one link would charge all three alike.
    Call it on every rank of the group at once."""
    import dataclasses
    import statistics
    import time

    import torch
    import torch.distributed as dist

    from ..estimate.cpu_kind import CALIBRATION_REPEATS

    repeats = repeats or CALIBRATION_REPEATS
    n = dist.get_world_size(group)
    out = []
    for c in est.collectives:
        if c.op not in TIMED_OPS or c.group_size != n or not c.calls:
            out.append(c)
            continue
        per_rank = max(1, -(-c.nbytes // (c.calls * 4 * n)))  # float32 elements of each rank's share
        full, shard = torch.zeros(per_rank * n), torch.zeros(per_rank)
        call = {"all_reduce": lambda: dist.all_reduce(full, group=group),
                "all_gather": lambda: dist.all_gather_into_tensor(full, shard, group=group),
                "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full, group=group)}[c.op]
        call()  # warm: the first call of a size sets up gloo's buffers
        seconds = []
        for _ in range(repeats):
            dist.barrier(group=group)
            t0 = time.perf_counter()
            call()
            seconds.append(time.perf_counter() - t0)
        out.append(dataclasses.replace(c, times_s={"measured": statistics.median(seconds) * c.calls}))
    return dataclasses.replace(est, collectives=out)


def predicted_step_for_run(args, run: str, world: int, device: str, precision: str, layers_per_stage=None,
                           probe=None, baseline_group=None) -> dict:
    """The step-time model's prediction of this run's step ('pred_step_ms', None where not predicted, and
    'pred_note' saying why): the Estimate of this run's layout on one host's shared memory
    (estimate.cpu_kind.cpu_cluster) and a CPU kind measured in this rank: `probe` (cpu_probe_for_run, sampled
    by the training loop between its timed steps; topped up to CALIBRATION_REPEATS samples here), else a
    fresh calibration. Call it on every rank at once, so that the calibration shares the cores and memory
    as the ranks' steps did. Predicted: float32 runs on CPU of a model the estimator has a shape for
    ('pred_cpu' holds the calibrated rates); not: CUDA runs (no calibrated GPU kind here) and bf16 autocast
    on CPU (its conversions are not in the model), nor ranks on forced hosts (RINGZERO_HOST_ID: the host lab,
whose shaped link the run does not know). A torch row's data-parallel collectives are timed on its own group
(`baseline_group`, timed_collectives): 'pred_measured_comm_ms' holds them per step (None for ringzero's rows,
whose collectives take the shared-memory link's model)."""
    from ..estimate import estimate
    from ..estimate.cpu_kind import CALIBRATION_REPEATS, GLOO_BYTES_PER_S, SHM_BYTES_PER_S, cpu_cluster
    from ..estimate.step_time import step_time

    why_not = _not_predicted(device, precision)
    if why_not:
        return {"pred_step_ms": None, "pred_note": f"not predicted: {why_not}"}
    model, _ = model_family(args).estimate_model()
    plan = _plan(args, run, world, layers_per_stage)
    link = GLOO_BYTES_PER_S if run in BASELINES else SHM_BYTES_PER_S  # a torch row's collectives run on gloo
    e = estimate(model, batch=args.batch, plan=plan, cluster=cpu_cluster(world, in_host_bytes_per_s=link))
    if e.model is None:
        return {"pred_step_ms": None, "pred_note": "not predicted: no shape for this model"}
    measured = None
    if run in BASELINES:  # gloo's time per call, measured on the row's own group in these minutes
        e = timed_collectives(e, baseline_group)
        measured = {c.what: c.times_s["measured"] * 1e3 for c in e.collectives if c.times_s and "measured" in c.times_s}
    probe = probe or cpu_probe_for_run(args, run, world, device, precision)
    while len(probe.samples) < CALIBRATION_REPEATS:
        probe.sample()
    kind = probe.kind()
    return {"pred_step_ms": step_time(e, kind).step_s * 1e3, "pred_note": None, "pred_measured_comm_ms": measured,
            "pred_cpu": {"gemm_flops_per_s": kind.peak_flops_per_s, "gemm_half_width": kind.gemm_half_width,
                         "memory_bytes_per_s": kind.hbm_bytes_per_s, "samples": len(probe.samples)}}
