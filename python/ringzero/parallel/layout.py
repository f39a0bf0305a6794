"""The one validated parallel layout: a strategy name over `world` ranks as pp pipeline stages times dp
data-parallel replicas (pipeline-major, as parallel.Mesh lays them out). `ringzero train` and
`ringzero.estimate.Plan` both build a Layout, so the rules and their messages live here only.

Errors are LayoutError (a ValueError) with a `key` naming the rule, so that a command line can word
the same rule with its own flags (`ringzero train` says --nproc where the estimator says world).
"""
from __future__ import annotations

import dataclasses

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "pp", "pp+zero1", "pp+zero2")
"""Data parallel: ddp, zero1-3. Pipeline: pp (stages only), pp+zero1/2 (stages x ZeRO over replicas)."""


class LayoutError(ValueError):
    """A layout that cannot exist. key: which rule ('strategy', 'positive', 'pp_divides_world',
    'pp_needs_pipeline', 'tp_divides_world'); values: the numbers in the message."""

    def __init__(self, key: str, message: str, **values):
        super().__init__(message)
        self.key, self.values = key, values


def is_pipeline(strategy: str) -> bool:
    """True for pp, pp+zero1, pp+zero2."""
    return strategy.startswith("pp")


def zero_stage_of(strategy: str) -> int:
    """0 for ddp and pp; else the ZeRO stage named by the strategy (1 shards optimizer state, 2 also
    gradients, 3 also parameters). Raises LayoutError for an unknown strategy."""
    check_strategy(strategy)
    return {"zero1": 1, "zero2": 2, "zero3": 3}.get(strategy.split("+")[-1], 0)


def check_strategy(strategy) -> str:
    if strategy not in STRATEGIES:
        raise LayoutError("strategy", f"strategy={strategy!r}: use one of {', '.join(STRATEGIES)}", strategy=strategy)
    return strategy


def default_stages(strategy: str, world: int) -> int:
    """Pipeline stages when none are given: every rank for pp, half of them for pp+zero*, 1 otherwise."""
    if not is_pipeline(strategy):
        return 1
    return world if strategy == "pp" else max(1, world // 2)


@dataclasses.dataclass(frozen=True)
class Layout:
    """`strategy` over `world` ranks with `pp` pipeline stages (see the module docstring)."""

    strategy: str
    """One of STRATEGIES."""
    world: int
    """All ranks."""
    pp: int = 1
    """Pipeline stages; divides world. Only pipeline strategies may have pp > 1."""
    tp: int = 1
    """Tensor-parallel ranks sharing each block's matrices (innermost, as in parallel.Mesh); pp * tp
    divides world. Every strategy may have tp > 1: its data parallelism then spans world / (pp * tp)."""

    def __post_init__(self):
        check_strategy(self.strategy)
        for name in ("world", "pp", "tp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise LayoutError("positive", f"{name} must be a positive int, got {v!r}", name=name, value=v)
        if self.world % self.pp:
            raise LayoutError("pp_divides_world",
                              f"pp={self.pp} pipeline stages do not divide world={self.world}; choose pp among "
                              f"the divisors of {self.world} or change --world", pp=self.pp, world=self.world)
        if self.pp > 1 and not is_pipeline(self.strategy):
            raise LayoutError("pp_needs_pipeline",
                              f"strategy {self.strategy} has no pipeline but pp={self.pp}; use --strategy pp, "
                              f"pp+zero1 or pp+zero2, or --pp 1", pp=self.pp)
        if self.world % (self.pp * self.tp):
            raise LayoutError("tp_divides_world",
                              f"pp={self.pp} stages x tp={self.tp} tensor-parallel ranks do not divide "
                              f"world={self.world}; choose tp among the divisors of {self.world // self.pp}",
                              pp=self.pp, tp=self.tp, world=self.world)

    @classmethod
    def of(cls, strategy: str, world: int, pp: int | None = None) -> "Layout":
        """The layout with `pp` stages, or default_stages when pp is None (ignored without a pipeline)."""
        check_strategy(strategy)
        stages = (pp or default_stages(strategy, world)) if is_pipeline(strategy) else 1
        return cls(strategy, world, stages)

    @property
    def dp(self) -> int:
        """Data-parallel replicas per pipeline stage (each replica is tp ranks)."""
        return self.world // (self.pp * self.tp)

    @property
    def zero_stage(self) -> int:
        return zero_stage_of(self.strategy)

    @property
    def pipeline(self) -> bool:
        return is_pipeline(self.strategy)
