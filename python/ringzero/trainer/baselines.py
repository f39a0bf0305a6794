"""The stock rows of `--compare`, each the like-for-like counterpart of a ringzero strategy: same model,
batches, warm-up, AdamW hyperparameters and clip, written with the other library's own API:

    torch-ddp        torch.nn.parallel.DistributedDataParallel                   (ddp)
    torch-fsdp2      torch.distributed.fsdp.fully_shard per layer, then the root (zero3)
    torch-pp         torch.distributed.pipelining, the same stages and schedule  (pp)   baselines_pipeline.py
    torch-tp         DTensor parallelize_module, the same split (and sequence    (tp)   baselines_tensor.py
                     parallelism with --sequence-parallel)
    torch-ep         torch.distributed.all_to_all_single under the same expert   (ep)   baselines_expert.py
                     sharding, torch DDP over the other parameters
    deepspeed-zeroK  deepspeed.initialize with ZeRO stage K                      (zeroK) baselines_deepspeed.py

The torch rows use torch.optim.AdamW and torch's gradient-norm clip. They run on env.baseline_group
(device.baseline_backend): gloo on CPU, NCCL on CUDA when every rank has its own GPU, the "ringzero"
backend when ranks share one. This module holds the torch data-parallel rows and what the other
baselines*.py share; registry.STOCK_ROWS says which class runs which row and which ringzero rows each
one's ratio is taken for (registry.LIKE_FOR_LIKE).
"""
from __future__ import annotations

import abc

import torch
import torch.distributed as dist

from ..parallel.layout import Layout
from .models import model_family
from .run import BETAS, WEIGHT_DECAY, RankEnv, RunCheckpoint, compute_module
from .strategies import DataParallelRun

def device_mesh(device_type: str, group):
    """A 1-D DeviceMesh over `group` (None: the default group's world) for the torch rows."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    if group is None:
        return init_device_mesh(device_type, (dist.get_world_size(),))
    if not hasattr(DeviceMesh, "from_group"):
        raise RuntimeError("a torch row on a separate group needs DeviceMesh.from_group, which this torch lacks")
    return DeviceMesh.from_group(group, device_type)


def torch_adamw(params, args) -> torch.optim.AdamW:
    """The optimizer of every torch row: torch.optim.AdamW with ringzero's hyperparameters."""
    return torch.optim.AdamW(params, lr=args.lr, betas=BETAS, weight_decay=WEIGHT_DECAY)


class TorchDataParallelRun(DataParallelRun):
    """A stock-torch data-parallel row: torch's wrapper (wrap(), one subclass per row) over the family's
    module, every rank its own slice of the batch, torch.optim.AdamW, torch's gradient-norm clip. No
    checkpoints: these rows exist for --compare."""

    @classmethod
    def create(cls, layout: Layout, model, args, env: RankEnv) -> TorchDataParallelRun:
        family = model_family(args)
        wrapped = cls.wrap(compute_module(family.module(model), env), family, env)
        return cls(wrapped, torch_adamw(wrapped.parameters(), args), args, dist.get_world_size(), dist.get_rank())

    @classmethod
    @abc.abstractmethod
    def wrap(cls, module: torch.nn.Module, family, env: RankEnv) -> torch.nn.Module:
        """`module` (this rank's whole model) in torch's data-parallel wrapper over env.baseline_group."""

    def clip(self, max_norm: float):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)

    def checkpoint(self) -> RunCheckpoint | None:
        return None


class TorchDDPRun(TorchDataParallelRun):
    """torch-ddp: torch.nn.parallel.DistributedDataParallel."""

    @classmethod
    def wrap(cls, module, family, env: RankEnv):
        ids = [env.device.index] if env.device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(module, device_ids=ids, process_group=env.baseline_group)


class TorchFSDP2Run(TorchDataParallelRun):
    """torch-fsdp2: fully_shard on each of the family's layers, then on the root."""

    @classmethod
    def wrap(cls, module, family, env: RankEnv):
        from torch.distributed.fsdp import fully_shard

        mesh = device_mesh(env.device.type, env.baseline_group)
        for layer in [m for m in module.modules() if isinstance(m, family.block)]:
            fully_shard(layer, mesh=mesh)
        return fully_shard(module, mesh=mesh)
