"""The stock-torch rows of `--compare`: torch-ddp (torch.nn.parallel.DistributedDataParallel) and
torch-fsdp2 (torch.distributed.fsdp.fully_shard on every Block, then the root), with torch.optim.AdamW
and torch.nn.utils.clip_grad_norm_, on the same model, batches, warm-up and clip as ringzero's rows.
They run on env.baseline_group (device.baseline_backend): gloo on CPU, NCCL on CUDA when every rank has
its own GPU, the "ringzero" backend when ranks share one.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..models import Block
from .strategies import BETAS, WEIGHT_DECAY, DataParallelRun, RankEnv, compute_module

MATCHING_BASELINE = {"ddp": "torch-ddp", "zero1": "torch-ddp", "zero2": "torch-fsdp2", "zero3": "torch-fsdp2",
                     "pp": "torch-ddp", "pp+zero1": "torch-ddp", "pp+zero2": "torch-fsdp2",
                     "tp": "torch-ddp", "tp+zero1": "torch-ddp", "3d": "torch-ddp"}
"""The torch row each ringzero row is divided by: replicated weights against DDP, sharded gradients
or weights against FSDP2 (FSDP2 shards weights too: ZeRO-3's match, an upper bound for ZeRO-2's
memory savings); the pipelines against the data-parallel row of the same sharding; the tensor-parallel
runs against torch-ddp (what splitting the model costs or saves beside plain data parallelism)."""


def _device_mesh(device_type: str, group):
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    if group is None:
        return init_device_mesh(device_type, (dist.get_world_size(),))
    if not hasattr(DeviceMesh, "from_group"):
        raise RuntimeError("torch-fsdp2 on a separate group needs DeviceMesh.from_group, which this torch lacks")
    return DeviceMesh.from_group(group, device_type)


class TorchBaselineRun(DataParallelRun):
    """A stock-torch data-parallel row; see the module docstring. No checkpoints (--compare only)."""

    @classmethod
    def create(cls, name: str, model, args, env: RankEnv) -> TorchBaselineRun:
        """`name` (torch-ddp or torch-fsdp2) over env.baseline_group, every rank its own slice."""
        module = compute_module(model, env)
        if name == "torch-ddp":
            ids = [env.device.index] if env.device.type == "cuda" else None
            wrapped = torch.nn.parallel.DistributedDataParallel(module, device_ids=ids,
                                                                process_group=env.baseline_group)
        elif name == "torch-fsdp2":
            from torch.distributed.fsdp import fully_shard

            mesh = _device_mesh(env.device.type, env.baseline_group)
            for block in [m for m in module.modules() if isinstance(m, Block)]:
                fully_shard(block, mesh=mesh)
            wrapped = fully_shard(module, mesh=mesh)
        else:
            raise ValueError(f"unknown torch baseline {name!r}; use torch-ddp or torch-fsdp2")
        opt = torch.optim.AdamW(wrapped.parameters(), lr=args.lr, betas=BETAS, weight_decay=WEIGHT_DECAY)
        return cls(wrapped, opt, args, dist.get_world_size(), dist.get_rank())

    def clip(self, max_norm: float):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)

    def checkpoint_objects(self):
        return None, None
