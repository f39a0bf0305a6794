"""Trains a small regression model with Ray Train's TorchTrainer on a local Ray cluster, 2 CPU workers,
TorchConfig(backend=BACKEND), and saves the initial and final parameters: run by tests/backend/test_frameworks.py
with "gloo" and "ringzero", one training after the other on one Ray cluster (its start and stop cost more
than a training). The workers never import ringzero: Ray makes their process group before the training
function runs, so "ringzero" is known there through torch's backend autoload alone
(python/ringzero_autoload.py).

    python tests/helpers/run_ray_train.py BACKEND OUT_PATH [BACKEND OUT_PATH ...]
"""
import os
import sys

import ray
import torch
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

STEPS, BATCH, FEATURES = 12, 8, 16


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def train_loop(config):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    backend_class = type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__
    model = DDP(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(world * STEPS * BATCH, FEATURES, generator=generator)
    y = x.sum(dim=1, keepdim=True).sin()
    for step in range(STEPS):  # rank r takes the r-th slice of each global batch
        start = (step * world + rank) * BATCH
        loss = torch.nn.functional.mse_loss(model(x[start:start + BATCH]), y[start:start + BATCH])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if rank == 0:
        torch.save({"final": {k: v.detach().clone() for k, v in model.module.state_dict().items()},
                    "backend_class": backend_class}, config["out_path"])


def main(runs: list[tuple[str, str]]) -> None:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        for backend, out_path in runs:
            trainer = TorchTrainer(train_loop, train_loop_config={"out_path": out_path},
                                   torch_config=TorchConfig(backend=backend),
                                   scaling_config=ScalingConfig(num_workers=2, use_gpu=False,
                                                                resources_per_worker={"CPU": 1}),
                                   run_config=RunConfig(storage_path=os.path.dirname(os.path.abspath(out_path)),
                                                        name=f"ray-train-{backend}"))
            trainer.fit()
            saved = torch.load(out_path)
            saved["initial"] = make_model().state_dict()
            torch.save(saved, out_path)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or len(args) % 2:
        sys.exit(f"usage: {sys.argv[0]} BACKEND OUT_PATH [BACKEND OUT_PATH ...]")
    main(list(zip(args[0::2], args[1::2])))
