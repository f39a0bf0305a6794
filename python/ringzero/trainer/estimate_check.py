"""The estimator's prediction for a run, put beside the measured peak memory (the cross-check)."""
from __future__ import annotations

from ..parallel.layout import STRATEGY_FORMS, StrategyForm, form_of
from .layout import BASELINE_LAYOUT, estimator_schedule, layout_of
from .models import model_family


def estimator_strategy(strategy: str) -> str:
    """The estimator's name for what a strategy does across its replicas: the one of the same pipeline and
    ZeRO stage without tensor or expert parallelism (tp -> ddp, 3d -> pp+zero1, ep+zero1 -> zero1). The
    estimator puts tp > 1 and ep > 1 under any strategy: Megatron's tensor parallelism inside every
    replica, the experts sharded over ep data-parallel ranks."""
    form = form_of(strategy)
    plain = StrategyForm(pipeline=form.pipeline, tensor_parallel=False, zero_stage=form.zero_stage)
    return next(name for name, f in STRATEGY_FORMS.items() if f == plain)


def estimate_for_run(args, run: str, world: int, layers_per_stage=None) -> dict:
    """ringzero.estimate's prediction for this run (float32 AdamW, the same model, batch and layout; a
    torch row takes the layout of its ringzero counterpart, layout.BASELINE_LAYOUT): the fullest rank's
    total, each rank's total (rank r is stage r // dp) and the terms of the fullest. A tensor-parallel
    run is estimated with its tp degree and sequence parallelism; its ranks' stages are r // (dp * tp). An
    expert-parallel run (--model moe) with its ep degree (layout.ep: every rank).
    A model the estimator has no shape for (an hf model: models.HFFamily.estimate_model) is given as its
    parameter count, so its activations are not estimated; "estimate_note" says so (None otherwise)."""
    from ..estimate import Plan, estimate

    layout = layout_of(run, world, args.pp, args.tp)
    plan = Plan(strategy=estimator_strategy(layout.strategy), world=world, pp=layout.pp,
                tp=layout.tp, sequence_parallel=bool(getattr(args, "sequence_parallel", False)) and layout.tp > 1,
                microbatches=args.microbatches if layout.pipeline else 1,
                schedule=estimator_schedule(args.schedule), recompute=getattr(args, "recompute", "none"),
                layers_per_stage=tuple(layers_per_stage) if layers_per_stage else None, ep=layout.ep)
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
