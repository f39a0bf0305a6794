"""deepspeed-zero1/2/3: DeepSpeed's ZeRO (deepspeed.initialize with zero_optimization.stage K) on the
--model family's module, as the like-for-like rows of zero1, zero2 and zero3.

The same batches (each rank its slice), torch.optim.AdamW with ringzero's hyperparameters handed to
DeepSpeed as the client optimizer, the warm-up set on its param groups each step, the global-norm clip
as DeepSpeed's gradient_clipping, float32 (no loss scaling). On CPU DeepSpeed runs with DS_ACCELERATOR=cpu
(set here before its import) over the ranks' gloo group; its first run JIT-compiles a small shared-memory
op (deepspeed_shm_comm_op), cached afterwards. Install: `pip install ringzero[baselines]`.
"""
from __future__ import annotations

import os

import torch.distributed as dist

from ..parallel.layout import Layout
from .baselines import torch_adamw
from .models import model_family
from .run import RankEnv, RunCheckpoint, compute_module, replica_slice, set_lr
from .strategies import DataParallelRun

BUCKET_ELEMENTS = 25 * 2**20 // 4
"""DeepSpeed's bucket sizes, in float32 elements: ringzero's and torch DDP's 25 MiB bucket cap. DeepSpeed's
default (5e8 elements) allocates a 1.9 GiB gradient bucket per rank on any model, which would be its
peak memory here. stage3_param_persistence_threshold=0: every parameter sharded, as ringzero's zero3
and FSDP2 shard them (the default keeps parameters under 1e5 elements whole on every rank)."""


def import_deepspeed(device_type: str):
    """The deepspeed module, its accelerator chosen for `device_type`; ImportError saying how to install it."""
    if device_type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
    except ImportError as e:
        raise ImportError("the deepspeed-zero rows need DeepSpeed: pip install ringzero[baselines]") from e
    return deepspeed


class DeepSpeedRun(DataParallelRun):
    """A DeepSpeed ZeRO row: `model` is the DeepSpeed engine, `opt` its optimizer (whose param groups take
    the warm-up); backward and step go through the engine, which clips and zeroes the gradients."""

    @classmethod
    def create(cls, layout: Layout, model, args, env: RankEnv) -> DeepSpeedRun:
        """ZeRO stage layout.zero_stage (deepspeed-zeroK takes zeroK's layout) over all ranks."""
        stage = layout.zero_stage
        deepspeed = import_deepspeed(env.device.type)
        world = dist.get_world_size()
        module = compute_module(model_family(args).module(model), env)
        config = {"train_batch_size": args.batch, "train_micro_batch_size_per_gpu": args.batch // world,
                  "gradient_accumulation_steps": 1, "gradient_clipping": float(args.clip),
                  "zero_optimization": {"stage": stage, "reduce_bucket_size": BUCKET_ELEMENTS,
                                        "allgather_bucket_size": BUCKET_ELEMENTS,
                                        "stage3_prefetch_bucket_size": BUCKET_ELEMENTS,
                                        "stage3_param_persistence_threshold": 0},
                  "zero_allow_untested_optimizer": True,
                  "steps_per_print": 10**9, "wall_clock_breakdown": False}
        zeropp = getattr(args, "zeropp", None)
        if stage == 3 and zeropp and zeropp != "none":  # ZeRO++ (DeepSpeed's names for hpz, qw, qg)
            from ..parallel.data_parallel.zeropp import parse

            opts = parse(zeropp, "--zeropp")
            per_host = int(os.environ.get("LOCAL_WORLD_SIZE", world))
            config["zero_optimization"].update({"zero_hpz_partition_size": per_host if opts.hpz else 1,
                                                "zero_quantized_weights": opts.qw,
                                                "zero_quantized_gradients": bool(opts.qg_bits)})
        deepspeed.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False)
        engine, opt, _, _ = deepspeed.initialize(model=module, optimizer=torch_adamw(module.parameters(), args),
                                                 config=config)
        return cls(engine, opt, args, world, dist.get_rank())

    def train_step(self, x, y, step: int) -> float:
        xs, ys = replica_slice(x, self.replicas, self.replica), replica_slice(y, self.replicas, self.replica)
        set_lr(self.opt, self.args.lr, step)
        loss = self.loss(xs, ys)
        self.model.backward(loss)
        self.model.step()
        out = loss.detach().reshape(1).to("cpu", copy=True)
        dist.all_reduce(out)
        return out.item() / self.replicas

    def checkpoint(self) -> RunCheckpoint | None:
        return None
