"""Which run.Run class runs each name `ringzero train` accepts (layout.RUNS): the one table, read by
the loop to build a run and by layout.check_run for each class's own refusals."""
from __future__ import annotations

from .baselines import TorchDDPRun, TorchFSDP2Run
from .baselines_deepspeed import DeepSpeedRun
from .baselines_expert import TorchExpertParallelRun
from .baselines_pipeline import TorchPipelineRun
from .baselines_tensor import TorchTensorParallelRun
from .run import Run
from .strategies import DataParallelRun, ExpertParallelRun, PipelineRun, TensorParallelRun

RUN_CLASSES: dict[str, type[Run]] = {
    "ddp": DataParallelRun, "zero1": DataParallelRun, "zero2": DataParallelRun, "zero3": DataParallelRun,
    "pp": PipelineRun, "pp+zero1": PipelineRun, "pp+zero2": PipelineRun,
    "tp": TensorParallelRun, "tp+zero1": TensorParallelRun,
    "3d": PipelineRun,  # pipeline stages cut from the tensor-parallel model
    "ep": ExpertParallelRun, "ep+zero1": ExpertParallelRun,  # --model moe
    "torch-ddp": TorchDDPRun, "torch-fsdp2": TorchFSDP2Run, "torch-pp": TorchPipelineRun,
    "torch-tp": TorchTensorParallelRun, "torch-ep": TorchExpertParallelRun,
    "deepspeed-zero1": DeepSpeedRun, "deepspeed-zero2": DeepSpeedRun, "deepspeed-zero3": DeepSpeedRun,
}
"""Name -> class; each class reads what differs between its names (the ZeRO stage, the stages, the
tensor-parallel size) from the Layout its create() is given."""


def run_class(name: str) -> type[Run]:
    """The class that runs `name`; ValueError listing the names for anything else."""
    try:
        return RUN_CLASSES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(RUN_CLASSES)}") from None
