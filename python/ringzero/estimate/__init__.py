"""ringzero estimate: memory per GPU and communication per step of a training configuration, with
collective times on a cluster by an alpha-beta model, the largest model that fits, the step time
(tokens/s, TFLOP/s per GPU, MFU) and a search of the layouts.

    from ringzero.estimate import estimate, Plan, Precision
    e = estimate(7_500_000_000, precision=Precision.for_dtype("bfloat16"), plan=Plan("zero2", world=64))
    e.model_state_bytes / 1e9     # 16.6 GB, the ZeRO paper's figure
    step_time(estimate(shape, 1536, ..., cluster=parse_cluster("1024xA100")[0]), GPU_KINDS["A100"]).mfu

Command line: `ringzero estimate --help` (also `python -m ringzero.estimate`).
"""
from .cli import main
from .communication import Collective
from .core import Estimate, StageMemory, as_model, estimate, largest_model
from .gpus import GPU_KINDS, GpuKind, gpu_kind
from .model import ACTIVATION_FORMULA, ModelShape, split_layers
from .moe import MoE, active_params
from .network import PRESETS, Cluster, GroupShape, Link, collective_times, custom_cluster, parse_cluster
from .plan import STRATEGIES, Plan, Precision
from .presets import KNOWN_MODELS, known_model
from .published import PUBLISHED_RUNS, PublishedRun
from .search import search
from .step_time import Overlap, StepTime, step_time

__all__ = [
    "estimate", "largest_model", "Estimate", "StageMemory", "Collective", "as_model", "ModelShape",
    "ACTIVATION_FORMULA", "split_layers", "Plan", "Precision", "STRATEGIES", "Cluster", "Link", "GroupShape",
    "PRESETS", "parse_cluster", "custom_cluster", "collective_times", "main", "MoE", "active_params", "KNOWN_MODELS",
    "known_model", "GPU_KINDS", "GpuKind", "gpu_kind", "PUBLISHED_RUNS", "PublishedRun", "search", "Overlap",
    "StepTime", "step_time",
]
