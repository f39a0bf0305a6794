"""What `ringzero train` checks before any rank starts: the names (strategies, torch baselines,
schedule) and the layout of each run, with parallel.layout.Layout's rules (shared with the estimator)
worded with this command's flags, plus what training adds (blocks per stage, batch splits, the
schedule's own microbatch rules)."""
from __future__ import annotations

from ..models.gpt import RECOMPUTE_KINDS
from ..parallel.layout import ALL_STRATEGIES, Layout, LayoutError, form_of
from ..parallel.pipeline.schedules import SCHEDULES, make_plan
from .registry import STOCK_ROWS, run_class

BASELINES = tuple(STOCK_ROWS)
"""Stock rows for --compare (registry.STOCK_ROWS, trainer/baselines*.py)."""
RUNS = ALL_STRATEGIES + BASELINES
"""Every name `ringzero train` accepts: ringzero's strategies, then the stock rows."""
BASELINE_LAYOUT = {name: row.layout for name, row in STOCK_ROWS.items()}
"""The ringzero strategy with the same memory layout: used for the estimate column and the checks."""
SCHEDULE_NOTES = {
    "Interleaved1F1B": "needs several stages per rank; ringzero train places one stage per rank",
}
"""Schedules that exist but that `ringzero train` cannot run, and why."""

_CLI_WORDING = {
    "pp_divides_world": "--pp {pp} must divide --nproc {world}",
    "positive": "--{name} must be at least 1",
    "tp_divides_world": "--tp {tp} must divide --nproc {world}",
    "pp_tp_divides_world": "--pp {pp} times --tp {tp} must divide --nproc {world}",
}


def layout_of(run: str, nproc: int, pp: int | None, tp: int | None = None) -> Layout:
    """The Layout of a run (a strategy or a torch baseline) on nproc ranks; ValueError worded with
    this command's flags. tp is ignored by runs without tensor parallelism (as pp is without a pipeline)."""
    strategy = BASELINE_LAYOUT.get(run, run)
    try:
        return Layout.of(strategy, nproc, pp, tp)
    except LayoutError as e:
        wording = _CLI_WORDING.get(e.key)
        raise ValueError(f"{run}: " + (wording.format(**e.values) if wording else str(e))) from None


def check_schedule(schedule: str) -> str:
    """The schedule name if `ringzero train` can run it; ValueError listing the valid names otherwise."""
    valid = [s for s in SCHEDULES if s not in SCHEDULE_NOTES]
    if schedule in SCHEDULE_NOTES:
        raise ValueError(f"--schedule {schedule}: {SCHEDULE_NOTES[schedule]}; use one of {', '.join(valid)}")
    if schedule not in SCHEDULES:
        raise ValueError(f"--schedule {schedule!r} is not a schedule; use one of {', '.join(valid)}")
    return schedule


def check_recompute(recompute: str) -> str:
    """The recompute kind if the model knows it; ValueError listing the kinds otherwise."""
    if recompute not in RECOMPUTE_KINDS:
        raise ValueError(f"--recompute {recompute!r} is not a recompute kind; use one of {', '.join(RECOMPUTE_KINDS)}")
    return recompute


def expert_parallel_runs() -> tuple[str, ...]:
    """The runs whose layout shards experts (ep, ep+zero1 and the stock torch-ep)."""
    return tuple(r for r in RUNS if form_of(BASELINE_LAYOUT.get(r, r)).expert_parallel)


def check_experts(run: str, layout: Layout, model) -> None:
    """The one rule between models and runs on experts: a mixture-of-experts model (model.moe_config) trains
    with the expert-parallel runs only (a dense run would drop its load-balancing loss; tp and pp do not
    split experts), and those runs need one. ValueError, one line, naming both."""
    runs = ", ".join(expert_parallel_runs())
    if model.moe_config is not None and not layout.expert_parallel:
        raise ValueError(f"{run} cannot train --model {model.name}: use an expert-parallel run ({runs})")
    if model.moe_config is None and layout.expert_parallel:
        raise ValueError(f"{run} shards the experts of a mixture-of-experts model: add --model moe "
                         f"(--model {model.name} has none)")


def check_run(run: str, nproc: int, pp: int | None, batch: int, microbatches: int, layers: int,
              schedule: str = "1F1B", precision: str = "fp32", tp: int | None = None, model=None,
              sequence_parallel: bool = False, recompute: str = "none") -> Layout:
    """Raises ValueError, before any rank starts, for a run that cannot work; returns its Layout.
    precision: the resolved one (device.precision_of), 'fp32' or 'bf16'. model: the run's model family
    (models.model_family), whose check() refuses what it cannot split (the tensor-parallel size against
    heads, MLP width, vocabulary, and the sequence with sequence_parallel). recompute: --recompute.
    The run's class (registry.run_class) adds its own refusals (Run.check: torch-pp's, torch-tp's)."""
    if run not in RUNS:
        raise ValueError(f"unknown strategy {run!r}; choose from {', '.join(RUNS)}")
    check_recompute(recompute)
    layout = layout_of(run, nproc, pp, tp)
    if model is not None:
        check_experts(run, layout, model)
        model.check(layout, sequence_parallel)
    run_class(run).check(layout, schedule, model)  # the run class's own rules, where its code lives
    stages, dp = layout.pp, layout.dp
    if run == "pp" and dp != 1:
        raise ValueError(f"pp: --pp {stages} with --nproc {nproc} leaves {dp} data-parallel replicas; use pp+zero1 or "
                         "pp+zero2 for that, or --pp equal to --nproc")
    if stages > layers + 2:
        raise ValueError(f"{run}: {stages} stages for {layers + 2} blocks (embedding, {layers} layers, head); "
                         "use fewer stages or more --layers")
    if batch % dp:
        raise ValueError(f"{run}: --batch {batch} must divide among {dp} data-parallel replicas")
    if layout.pipeline:
        if (batch // dp) % microbatches:
            raise ValueError(f"{run}: the per-replica batch {batch // dp} must divide into --microbatches {microbatches}")
        check_schedule(schedule)
        try:
            plan = make_plan(schedule, stages, microbatches)
        except ValueError as e:
            raise ValueError(f"{run} with --schedule {schedule}: {e}") from None
        if plan.split_backward and layout.zero_stage:
            raise ValueError(f"{run}: --schedule {schedule} splits the backward, which ringzero's ZeRO wrappers do "
                             "not support; use GPipe or 1F1B with pp+zero*, or --strategy pp")
        if plan.split_backward and precision != "fp32":
            # weight_grad.py's deferred Linear backward multiplies in the parameters' dtype (float32),
            # which autocast's bf16 activations do not match.
            raise ValueError(f"{run}: --schedule {schedule} runs in float32 only; add --precision fp32 or use "
                             "GPipe or 1F1B")
        if plan.split_backward and recompute == "full":
            # weight_grad.py routes a Linear through its deferred-gradient store only while the runtime's
            # forward has a key set; a full recomputation runs inside the backward, without that key, so the
            # rebuilt block's Linears save other tensors than the forward's (torch's CheckpointError).
            # 'selective' recomputes only the attention core, which has no Linear: it works.
            raise ValueError(f"{run}: --schedule {schedule} splits the backward, which --recompute full cannot follow "
                             "(the recomputed block would not defer its Linear weight gradients); use GPipe or 1F1B "
                             "with --recompute full, or --recompute selective")
    return layout


def estimator_schedule(schedule: str) -> str:
    """The estimator's activation model for a runtime schedule: GPipe keeps all microbatches in
    flight; 1F1B and ZB-H1 at most the stage count."""
    return "gpipe" if schedule == "GPipe" else "1f1b"
