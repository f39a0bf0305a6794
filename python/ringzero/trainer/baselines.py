"""The stock rows of `--compare`, each the like-for-like counterpart of a ringzero strategy: same model,
batches, warm-up, AdamW hyperparameters and clip, written with the other library's own API:

    torch-ddp        torch.nn.parallel.DistributedDataParallel                   (ddp)
    torch-fsdp2      torch.distributed.fsdp.fully_shard per layer, then the root (zero3)
    torch-pp         torch.distributed.pipelining, the same stages and schedule  (pp)   baselines_pipeline.py
    torch-tp         DTensor parallelize_module, the same split (and sequence    (tp)   baselines_tensor.py
                     parallelism with --sequence-parallel)
    deepspeed-zeroK  deepspeed.initialize with ZeRO stage K                      (zeroK) baselines_deepspeed.py

The torch rows use torch.optim.AdamW and torch's gradient-norm clip. They run on env.baseline_group
(device.baseline_backend): gloo on CPU, NCCL on CUDA when every rank has its own GPU, the "ringzero"
backend when ranks share one. LIKE_FOR_LIKE says which row each ringzero row's ratio is taken against.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .models import model_family
from .strategies import BETAS, WEIGHT_DECAY, DataParallelRun, RankEnv, compute_module

LIKE_FOR_LIKE = {
    "ddp": ("torch-ddp",), "zero1": ("deepspeed-zero1", "torch-ddp"), "zero2": ("deepspeed-zero2", "torch-fsdp2"),
    "zero3": ("torch-fsdp2", "deepspeed-zero3"), "pp": ("torch-pp", "torch-ddp"),
    "pp+zero1": ("torch-ddp",), "pp+zero2": ("torch-fsdp2",),
    "tp": ("torch-tp", "torch-ddp"), "tp+zero1": ("torch-tp", "torch-ddp"), "3d": ("torch-ddp",)}
"""For each ringzero row, the stock rows its ratio may be taken against, the like-for-like one first; the
first that ran is used (report.ratios). zero1/zero2 against DeepSpeed's same stage (else DDP, the same
replicated weights, and FSDP2, an upper bound for ZeRO-2's memory savings); zero3 against FSDP2, whose
sharding is ZeRO-3's; pp and tp against torch's pipelining and DTensor on the same split; the runs
without a stock counterpart (pp+zeroK, 3d) against the data-parallel row of the same sharding."""


def _device_mesh(device_type: str, group):
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    if group is None:
        return init_device_mesh(device_type, (dist.get_world_size(),))
    if not hasattr(DeviceMesh, "from_group"):
        raise RuntimeError("a torch row on a separate group needs DeviceMesh.from_group, which this torch lacks")
    return DeviceMesh.from_group(group, device_type)


def torch_adamw(params, args) -> torch.optim.AdamW:
    """The optimizer of every torch row: torch.optim.AdamW with ringzero's hyperparameters."""
    return torch.optim.AdamW(params, lr=args.lr, betas=BETAS, weight_decay=WEIGHT_DECAY)


class TorchBaselineRun(DataParallelRun):
    """A stock-torch data-parallel row (torch-ddp, torch-fsdp2); see the module docstring."""

    @classmethod
    def create(cls, name: str, model, args, env: RankEnv) -> TorchBaselineRun:
        """`name` (torch-ddp or torch-fsdp2) over env.baseline_group, every rank its own slice; FSDP2's
        units are the family's layers."""
        family = model_family(args)
        module = compute_module(family.module(model), env)
        if name == "torch-ddp":
            ids = [env.device.index] if env.device.type == "cuda" else None
            wrapped = torch.nn.parallel.DistributedDataParallel(module, device_ids=ids,
                                                                process_group=env.baseline_group)
        elif name == "torch-fsdp2":
            from torch.distributed.fsdp import fully_shard

            mesh = _device_mesh(env.device.type, env.baseline_group)
            for layer in [m for m in module.modules() if isinstance(m, family.block)]:
                fully_shard(layer, mesh=mesh)
            wrapped = fully_shard(module, mesh=mesh)
        else:
            raise ValueError(f"unknown torch data-parallel baseline {name!r}; use torch-ddp or torch-fsdp2")
        return cls(wrapped, torch_adamw(wrapped.parameters(), args), args, dist.get_world_size(), dist.get_rank())

    def clip(self, max_norm: float):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)

    def checkpoint_objects(self):
        return None, None


def make_baseline_run(name: str, model, args, env: RankEnv):
    """The run object of the stock row `name` (layout.BASELINES) on this rank; every rank calls it.
    No checkpoints: these rows exist for --compare."""
    if name == "torch-pp":
        from .baselines_pipeline import TorchPipelineRun

        return TorchPipelineRun.create(model, args, env)
    if name == "torch-tp":
        from .baselines_tensor import TorchTensorParallelRun

        return TorchTensorParallelRun.create(model, args, env)
    if name.startswith("deepspeed-zero"):
        from .baselines_deepspeed import DeepSpeedRun

        return DeepSpeedRun.create(int(name[len("deepspeed-zero"):]), model, args, env)
    return TorchBaselineRun.create(name, model, args, env)
