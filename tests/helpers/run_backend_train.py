"""Stock DDP and stock FSDP2 training of a tiny ringzero.models.GPT on a given process group; used by
tests/backend/test_backend_training.py (forked ranks) and, as a script, by tests/backend/test_backend_torchrun.py:

    torchrun --nproc-per-node 2 tests/helpers/run_backend_train.py --backend ringzero

As a script it trains with DDP on the default group (made with --backend) and on a gloo group over
the same ranks in the same run, and exits non-zero unless the final parameters agree (bitwise, or
within --atol where the reduction order may differ) and the ringzero backend ran the all-reduces.
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist

from ringzero.models import GPT, GPTConfig, lm_loss

CFG = GPTConfig(vocab_size=64, seq_len=16, n_layer=2, n_head=2, d_model=32, mlp_ratio=2)
BATCH = 2


def _batch(step: int, ranks, device="cpu"):
    """Rank r's batch of `step` for each r of `ranks` (an int: one rank), concatenated."""
    parts = []
    for rank in [ranks] if isinstance(ranks, int) else ranks:
        g = torch.Generator().manual_seed(1000 * step + rank)
        parts.append(torch.randint(0, CFG.vocab_size, (BATCH, CFG.seq_len + 1), generator=g))
    tokens = torch.cat(parts).to(device)
    return tokens[:, :-1], tokens[:, 1:]


def _model(device="cpu"):
    torch.manual_seed(0)  # the same initial parameters on every rank and for every run
    return GPT(CFG).to(device)


def _steps(model, optim, steps: int, ranks, device="cpu"):
    for step in range(steps):
        x, y = _batch(step, ranks, device)
        optim.zero_grad(set_to_none=True)
        lm_loss(model(x), y).backward()
        optim.step()


def train_whole_batch(world: int, steps: int = 20, device="cpu") -> torch.Tensor:
    """The reference of data parallelism: one process, no process group, training on the batches of all
    `world` ranks at once (the mean loss over the whole batch has the gradient DDP and FSDP2 average)."""
    model = _model(device)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _steps(model, optim, steps, range(world), device)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def train_ddp(group, steps: int = 20, python_hook: bool = False, device="cpu", compile: bool = False) -> torch.Tensor:
    """Stock torch DDP on `group` (AdamW); returns all parameters flattened (float32, 1D).
    python_hook: use torch's Python allreduce_hook, which chains on the Work's future.
    compile: train torch.compile(ddp) (dynamo's DDPOptimizer splits the graph at the buckets)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _model(device)
    # A small bucket cap gives several buckets, so several all-reduces overlap the backward pass.
    # (DDPOptimizer refuses buckets smaller than DDP's 1 MB first bucket: compiled runs keep the default.)
    ddp = DDP(model, process_group=group, **({} if compile else {"bucket_cap_mb": 0.05}))
    if python_hook:
        ddp.register_comm_hook(group, default_hooks.allreduce_hook)
    optim = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    _steps(torch.compile(ddp) if compile else ddp, optim, steps, dist.get_rank(group), device)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def train_fsdp2(group, steps: int = 20, device="cpu") -> torch.Tensor:
    """Stock FSDP2 (fully_shard per block and at the root) on `group`; returns the full parameters
    flattened (gathered with DTensor.full_tensor, so through the group's all-gather)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, torch.device(device).type)
    model = _model(device)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _steps(model, optim, steps, dist.get_rank(group), device)
    return torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", default="ringzero", help="backend string for init_process_group")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--atol", type=float, default=0.0, help="0 means bitwise")
    args = parser.parse_args(argv)

    import ringzero  # registers the backend

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    ours = train_ddp(dist.group.WORLD, args.steps)
    ref = train_ddp(gloo, args.steps)
    stats = ringzero.backend_stats()
    diff = (ours - ref).abs().max().item()
    ok = torch.equal(ours, ref) if args.atol == 0 else diff <= args.atol
    ran_ours = stats["native"].get("allreduce", 0) > 0 and "allreduce" not in stats["fallback"]
    print(f"rank {rank}/{world} backend={args.backend}: max |ringzero - gloo| = {diff:.3g}, "
          f"ringzero ops {stats['native']}, handed on {stats['fallback']}", flush=True)
    dist.destroy_process_group()
    ringzero.destroy_communicators()
    return 0 if ok and ran_ours else 1


if __name__ == "__main__":
    sys.exit(main())
