"""The one table of the names `ringzero train` accepts and what each runs. ringzero's own strategies are
parallel.layout.STRATEGY_FORMS (shared with the estimator); their Run class follows from their form. The
stock rows are STOCK_ROWS below. Everything else that lists names derives from these two: RUN_CLASSES,
LIKE_FOR_LIKE here, layout.BASELINES, layout.BASELINE_LAYOUT and layout.RUNS
(tests/house/test_structure.py fails on a name listed in one place only)."""
from __future__ import annotations

import dataclasses

from ..parallel.layout import STRATEGY_FORMS, StrategyForm
from .baselines import TorchDDPRun, TorchFSDP2Run
from .baselines_deepspeed import DeepSpeedRun
from .baselines_expert import TorchExpertParallelRun
from .baselines_pipeline import TorchPipelineRun
from .baselines_tensor import TorchTensorParallelRun
from .run import Run
from .strategies import DataParallelRun, ExpertParallelRun, PipelineRun, TensorParallelRun


@dataclasses.dataclass(frozen=True)
class StockRow:
    """A row of `--compare` written with another library's API (baselines*.py)."""

    run_class: type[Run]
    layout: str
    """The ringzero strategy with the same memory layout: its estimate column and its checks."""
    first_for: tuple[str, ...] = ()
    """The ringzero strategies whose ratio is taken against this row first (their like-for-like row)."""
    else_for: tuple[str, ...] = ()
    """The ringzero strategies whose ratio is taken against this row when their first did not run."""


STOCK_ROWS: dict[str, StockRow] = {
    "torch-ddp": StockRow(TorchDDPRun, "ddp", first_for=("ddp", "pp+zero1", "3d"),
                          else_for=("zero1", "pp", "tp", "tp+zero1")),
    "torch-fsdp2": StockRow(TorchFSDP2Run, "zero3", first_for=("zero3", "pp+zero2"), else_for=("zero2",)),
    "torch-pp": StockRow(TorchPipelineRun, "pp", first_for=("pp",)),
    "torch-tp": StockRow(TorchTensorParallelRun, "tp", first_for=("tp", "tp+zero1")),
    "torch-ep": StockRow(TorchExpertParallelRun, "ep", first_for=("ep", "ep+zero1")),
    "deepspeed-zero1": StockRow(DeepSpeedRun, "zero1", first_for=("zero1",)),
    "deepspeed-zero2": StockRow(DeepSpeedRun, "zero2", first_for=("zero2",)),
    "deepspeed-zero3": StockRow(DeepSpeedRun, "zero3", else_for=("zero3",)),
}
"""Stock rows, in the order --help lists them: torch DDP, FSDP2, torch.distributed.pipelining, DTensor
tensor parallelism, expert parallelism over torch.distributed.all_to_all_single with torch DDP, and
DeepSpeed's ZeRO stages (when deepspeed is installed). zero1/zero2 compare with DeepSpeed's same stage
(else DDP, the same replicated weights, and FSDP2, an upper bound for ZeRO-2's memory savings); zero3 with
FSDP2, whose sharding is ZeRO-3's; pp and tp with torch's pipelining and DTensor on the same split; ep and
ep+zero1 with torch-ep (the same experts per rank over torch's all-to-all); the runs without a stock
counterpart (pp+zeroK, 3d) with the data-parallel row of the same sharding."""


def strategy_class(form: StrategyForm) -> type[Run]:
    """The class that runs a ringzero strategy of this form: a pipeline first (3d cuts its stages from the
    tensor-parallel model), then tensor, then expert parallelism, else data parallelism."""
    if form.pipeline:
        return PipelineRun
    if form.tensor_parallel:
        return TensorParallelRun
    if form.expert_parallel:
        return ExpertParallelRun
    return DataParallelRun


RUN_CLASSES: dict[str, type[Run]] = {**{name: strategy_class(form) for name, form in STRATEGY_FORMS.items()},
                                     **{name: row.run_class for name, row in STOCK_ROWS.items()}}
"""Name -> class; each class reads what differs between its names (the ZeRO stage, the stages, the
tensor-parallel size) from the Layout its create() is given."""
LIKE_FOR_LIKE: dict[str, tuple[str, ...]] = {
    strategy: tuple(n for n, row in STOCK_ROWS.items() if strategy in row.first_for)
    + tuple(n for n, row in STOCK_ROWS.items() if strategy in row.else_for)
    for strategy in STRATEGY_FORMS}
"""For each ringzero row, the stock rows its ratio may be taken against, the like-for-like one first; the
first that ran is used (report.ratios)."""


def run_class(name: str) -> type[Run]:
    """The class that runs `name`; ValueError listing the names for anything else."""
    try:
        return RUN_CLASSES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(RUN_CLASSES)}") from None
