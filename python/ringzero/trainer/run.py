"""What a training run is to the loop (loop.py): the Run interface that ringzero's strategies
(strategies.py) and the stock rows (baselines*.py) all implement, the environment a run is built in, and
what every run shares (warm-up, AdamW hyperparameters, a replica's slice of the batch). registry.py says
which class runs which name."""
from __future__ import annotations

import abc
import dataclasses
from typing import Sequence

import torch

from ..parallel.layout import Layout
from .device import Autocast

WARMUP_STEPS = 10
BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1


@dataclasses.dataclass
class RankEnv:
    """How this rank computes: decided once per rank (device.py), read by every run."""

    device: torch.device
    """This rank's device (cpu, or its GPU)."""
    precision: str
    """'fp32', or 'bf16': autocast compute with float32 weights, masters, gradients and reductions."""
    transport: str
    """Pipeline point-to-point: 'gloo', 'nccl' or 'ipc' (parallel.pipeline.transport)."""
    baseline_group: object = None
    """The group the stock-torch rows run on (None: the default group)."""


@dataclasses.dataclass(frozen=True)
class RunCheckpoint:
    """What ringzero.checkpoint saves and loads for a run."""

    model: torch.nn.Module
    """The data-parallel wrapper (DistributedDataParallel or ZeroDataParallel) over this rank's module."""
    optimizer: torch.optim.Optimizer
    """Its optimizer, built on model.parameters()."""


class Run(abc.ABC):
    """One rank's part of a training run. Every rank calls create() with the run's Layout; the loop then
    calls train_step once a step and val_loss at validation, both collective over all ranks."""

    layers_per_stage: Sequence[int] | None = None
    """Layers (of the model family's layer class) on each pipeline stage, first to last, for the memory
    estimate (estimate.Plan.layers_per_stage); None for a run without pipeline stages."""

    @classmethod
    def check(cls, layout: Layout, schedule: str, family=None) -> None:
        """ValueError, before any rank starts (trainer/layout.check_run), for what this run class cannot
        train beyond the layout's own rules; `family` is the model family (models.model_family) or None.
        The default refuses nothing."""

    @classmethod
    @abc.abstractmethod
    def create(cls, layout: Layout, model: torch.nn.Module, args, env: RankEnv) -> Run:
        """This rank's run of `layout` training `model` (whole on every rank, on env.device, as the family of
        --model built it); `args` are `ringzero train`'s. Every rank calls it."""

    @abc.abstractmethod
    def train_step(self, x: torch.Tensor, y: torch.Tensor, step: int) -> float:
        """One optimizer step on the global batch x, y ((batch, seq) int64 on env.device, the same on every
        rank); returns the global mean loss as a host float."""

    @abc.abstractmethod
    def val_loss(self, batches) -> float:
        """The mean loss over `batches` (a list of global (x, y) batches), without training."""

    def checkpoint(self) -> RunCheckpoint | None:
        """What --save-every and --resume save and load, or None for a run without checkpoints (the
        pipeline runs and the stock rows)."""
        return None

    def exchange_seconds(self) -> float | None:
        """Seconds this rank has spent so far inside the all-to-alls of expert parallelism (the counts, the
        dispatch and the combine, forward and backward), timed around the exchange function the same way
        for ringzero's and torch's (strategies.TimedExchange): the table's a2a column. None for a run
        without them."""
        return None

    def summary(self) -> dict:
        """What this run adds to its results.json entry after training (the expert-parallel runs: their
        load-balancing losses). Collective: every rank calls it once. The default adds nothing."""
        return {}


def set_lr(opt, lr: float, step: int):
    """Linear warm-up over WARMUP_STEPS steps, then constant."""
    scale = min(1.0, (step + 1) / WARMUP_STEPS)
    for g in opt.param_groups:
        g["lr"] = lr * scale


def compute_module(module: torch.nn.Module, env: RankEnv) -> torch.nn.Module:
    """`module` as it computes on this rank: under bf16 autocast when env says so."""
    return Autocast(module, env.device, env.precision) if env.precision == "bf16" else module


def replica_slice(t: torch.Tensor, parts: int, index: int) -> torch.Tensor:
    """Slice `index` of `parts` equal slices of `t` along its first (batch) dimension."""
    per = t.shape[0] // parts
    return t[index * per:(index + 1) * per]
