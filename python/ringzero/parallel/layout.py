"""The one validated parallel layout: a strategy name over `world` ranks as pp pipeline stages times dp
data-parallel replicas times tp tensor-parallel shards (pipeline-major, tensor innermost, as
parallel.Mesh lays them out). `ringzero train` and `ringzero.estimate.Plan` both build a Layout, so the
rules and their messages live here only.

Errors are LayoutError (a ValueError) with a `key` naming the rule, so that a command line can word
the same rule with its own flags (`ringzero train` says --nproc where the estimator says world).
"""
from __future__ import annotations

import dataclasses

@dataclasses.dataclass(frozen=True)
class StrategyForm:
    """What a strategy name stands for, read once from STRATEGY_FORMS."""

    pipeline: bool
    """Pipeline stages (pp may exceed 1)."""
    tensor_parallel: bool
    """Tensor-parallel shards inside every replica (tp may exceed 1 in `ringzero train`)."""
    zero_stage: int
    """0: replicated (DDP); 1 shards optimizer state, 2 also gradients, 3 also parameters, over the replicas."""
    expert_parallel: bool = False
    """The experts of a mixture-of-experts model sharded over every rank (ep = dp = world, parallel/expert/);
    the other parameters data parallel as zero_stage says."""


STRATEGY_FORMS = {
    "ddp": StrategyForm(pipeline=False, tensor_parallel=False, zero_stage=0),
    "zero1": StrategyForm(pipeline=False, tensor_parallel=False, zero_stage=1),
    "zero2": StrategyForm(pipeline=False, tensor_parallel=False, zero_stage=2),
    "zero3": StrategyForm(pipeline=False, tensor_parallel=False, zero_stage=3),
    "pp": StrategyForm(pipeline=True, tensor_parallel=False, zero_stage=0),
    "pp+zero1": StrategyForm(pipeline=True, tensor_parallel=False, zero_stage=1),
    "pp+zero2": StrategyForm(pipeline=True, tensor_parallel=False, zero_stage=2),
    "tp": StrategyForm(pipeline=False, tensor_parallel=True, zero_stage=0),
    "tp+zero1": StrategyForm(pipeline=False, tensor_parallel=True, zero_stage=1),
    "3d": StrategyForm(pipeline=True, tensor_parallel=True, zero_stage=1),
    "ep": StrategyForm(pipeline=False, tensor_parallel=False, zero_stage=0, expert_parallel=True),
    "ep+zero1": StrategyForm(pipeline=False, tensor_parallel=False, zero_stage=1, expert_parallel=True),
}
"""Every strategy name and its form: the one place a name is read, so nothing parses names elsewhere."""


def without_pipeline(strategy: str) -> str:
    """The strategy of the same form without pipeline stages (pp+zero1 -> zero1, pp -> ddp; a strategy
    without a pipeline is itself): what a layout with pp = 1 runs."""
    form = dataclasses.replace(STRATEGY_FORMS[strategy], pipeline=False)
    return next(name for name, f in STRATEGY_FORMS.items() if f == form)


STRATEGIES = tuple(name for name, form in STRATEGY_FORMS.items()
                   if not form.tensor_parallel and not form.expert_parallel)
"""Data parallel: ddp, zero1-3. Pipeline: pp (stages only), pp+zero1/2 (stages x ZeRO over replicas).
The strategies ringzero.estimate takes; each may have tp > 1 there (Megatron's tensor parallelism
inside every replica)."""
TENSOR_PARALLEL_STRATEGIES = tuple(name for name, form in STRATEGY_FORMS.items() if form.tensor_parallel)
"""tp: tensor parallel over tp ranks x DDP over the dp replicas; tp+zero1: ZeRO-1 over the replicas;
3d: pp pipeline stages, each tensor parallel over tp ranks, ZeRO-1 over the dp replicas of a stage."""
EXPERT_PARALLEL_STRATEGIES = tuple(name for name, form in STRATEGY_FORMS.items() if form.expert_parallel)
"""ep: a mixture-of-experts model's experts sharded over all ranks, its other parameters under DDP; ep+zero1:
those under ZeRO-1 instead (`ringzero train --model moe`; not modelled by the estimator yet)."""
ALL_STRATEGIES = STRATEGIES + TENSOR_PARALLEL_STRATEGIES + EXPERT_PARALLEL_STRATEGIES
"""What `ringzero train` runs."""


class LayoutError(ValueError):
    """A layout that cannot exist. key: which rule ('strategy', 'positive', 'pp_divides_world',
    'pp_needs_pipeline', 'tp_divides_world', 'pp_tp_divides_world', 'tp_divides_model'); values: the
    numbers in the message."""

    def __init__(self, key: str, message: str, **values):
        super().__init__(message)
        self.key, self.values = key, values


def form_of(strategy) -> StrategyForm:
    """The form of `strategy`; LayoutError ('strategy') naming the valid names for anything else."""
    if not isinstance(strategy, str) or strategy not in STRATEGY_FORMS:
        raise LayoutError("strategy", f"strategy={strategy!r}: use one of {', '.join(ALL_STRATEGIES)}",
                          strategy=strategy)
    return STRATEGY_FORMS[strategy]


def check_strategy(strategy) -> str:
    """`strategy` if it is one of ALL_STRATEGIES; LayoutError ('strategy') otherwise."""
    form_of(strategy)
    return strategy


def is_tensor_parallel(strategy: str) -> bool:
    """True for tp, tp+zero1 and 3d (False for a name that is not a strategy)."""
    form = STRATEGY_FORMS.get(strategy) if isinstance(strategy, str) else None
    return form is not None and form.tensor_parallel


def zero_stage_of(strategy: str) -> int:
    """0 for ddp, pp and tp; else the ZeRO stage named by the strategy (1 shards optimizer state, 2 also
    gradients, 3 also parameters; 3d is ZeRO-1 over its replicas). Raises LayoutError for an unknown
    strategy."""
    return form_of(strategy).zero_stage


def default_stages(strategy: str, world: int) -> int:
    """Pipeline stages when none are given: every rank for pp, half of them for pp+zero*, 2 for 3d, 1
    otherwise."""
    form = form_of(strategy)
    if not form.pipeline:
        return 1
    if form.tensor_parallel:  # 3d
        return 2
    return max(1, world // 2) if form.zero_stage else world


def default_tensor_parallel(strategy: str, world: int, pp: int) -> int:
    """Tensor-parallel ranks when none are given: all of them for tp and tp+zero1, 2 for 3d, 1 otherwise."""
    form = form_of(strategy)
    if not form.tensor_parallel:
        return 1
    return 2 if form.pipeline else world // pp


def _check_positive(**values):
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise LayoutError("positive", f"{name} must be a positive int, got {v!r}", name=name, value=v)


@dataclasses.dataclass(frozen=True)
class Layout:
    """`strategy` over `world` ranks with `pp` pipeline stages and `tp` tensor-parallel ranks per
    replica of a stage (see the module docstring). Validated once, at construction; the fields after
    `tp` are derived there and never re-read from the name."""

    strategy: str
    """One of ALL_STRATEGIES."""
    world: int
    """All ranks."""
    pp: int = 1
    """Pipeline stages; divides world. Only pipeline strategies may have pp > 1."""
    tp: int = 1
    """Tensor-parallel ranks (innermost); pp * tp divides world. `ringzero train` runs tp > 1 only as tp,
    tp+zero1 and 3d (Layout.of ignores tp for the others); the estimator models it under every strategy."""
    dp: int = dataclasses.field(init=False)
    """Data-parallel replicas per pipeline stage (of tp ranks each): world // (pp * tp)."""
    zero_stage: int = dataclasses.field(init=False)
    """The strategy's ZeRO stage over the replicas (0: none; StrategyForm.zero_stage)."""
    pipeline: bool = dataclasses.field(init=False)
    """The strategy has pipeline stages (pp, pp+zero1, pp+zero2, 3d)."""
    tensor_parallel: bool = dataclasses.field(init=False)
    """The strategy shards every replica over tensor-parallel ranks (tp, tp+zero1, 3d)."""
    expert_parallel: bool = dataclasses.field(init=False)
    """The strategy shards a mixture-of-experts model's experts over every rank (ep, ep+zero1)."""
    ep: int = dataclasses.field(init=False)
    """Ranks the experts are sharded over: dp (all ranks) for an expert-parallel strategy, else 1."""

    def __post_init__(self):
        form = form_of(self.strategy)
        _check_positive(world=self.world, pp=self.pp, tp=self.tp)
        if self.world % self.pp:
            raise LayoutError("pp_divides_world",
                              f"pp={self.pp} pipeline stages do not divide world={self.world}; choose pp among "
                              f"the divisors of {self.world} or change --world", pp=self.pp, world=self.world)
        if self.world % self.tp:
            raise LayoutError("tp_divides_world",
                              f"tp={self.tp} tensor-parallel ranks do not divide world={self.world}; choose tp "
                              f"among the divisors of {self.world}", tp=self.tp, world=self.world)
        if self.world % (self.pp * self.tp):
            raise LayoutError("pp_tp_divides_world",
                              f"pp * tp = {self.pp} * {self.tp} = {self.pp * self.tp} does not divide "
                              f"world={self.world}", pp=self.pp, tp=self.tp, world=self.world)
        if self.pp > 1 and not form.pipeline:
            raise LayoutError("pp_needs_pipeline",
                              f"strategy {self.strategy} has no pipeline but pp={self.pp}; use --strategy pp, "
                              f"pp+zero1, pp+zero2 or 3d, or --pp 1", pp=self.pp)
        dp = self.world // (self.pp * self.tp)
        derived = dict(dp=dp, zero_stage=form.zero_stage, pipeline=form.pipeline,
                       tensor_parallel=form.tensor_parallel, expert_parallel=form.expert_parallel,
                       ep=dp if form.expert_parallel else 1)
        for name, value in derived.items():
            object.__setattr__(self, name, value)  # frozen: set once, here

    @classmethod
    def of(cls, strategy: str, world: int, pp: int | None = None, tp: int | None = None) -> "Layout":
        """The layout with `pp` stages and `tp` tensor-parallel ranks, or their defaults when None
        (default_stages, default_tensor_parallel); each is ignored by strategies without that axis."""
        form = form_of(strategy)
        stages = (pp or default_stages(strategy, world)) if form.pipeline else 1
        if form.tensor_parallel:
            _check_positive(pp=stages)
            shards = tp or default_tensor_parallel(strategy, world, stages)
        else:
            shards = 1
        return cls(strategy, world, stages, shards)

    def check_model(self, cfg, sequence_parallel: bool = False):
        """LayoutError ('tp_divides_model') unless tp divides what tensor parallelism splits in the
        models.GPTConfig `cfg`: n_head, d_model * mlp_ratio, vocab_size, and with sequence parallelism
        seq_len (parallel.tensor_parallel.tensor_gpt's rules)."""
        from .tensor_parallel.tensor_gpt import check_tensor_parallel_config

        try:
            check_tensor_parallel_config(cfg, self.tp, sequence_parallel)
        except ValueError as e:
            raise LayoutError("tp_divides_model", str(e), tp=self.tp) from None
