"""Trains a small regression model with HF Accelerate on CPU ranks started by torchrun, the process
group made first with BACKEND (Accelerate itself picks gloo on CPU and refuses another name, but it
keeps a default group that exists already), and rank 0 saves the initial and final parameters: run by
tests/backend/test_frameworks.py once with "gloo" and once with "ringzero".

    torchrun --nproc-per-node 2 tests/helpers/run_accelerate_train.py BACKEND OUT_PATH
"""
import sys

import torch
import torch.distributed as dist
from accelerate import Accelerator

STEPS, BATCH, FEATURES = 12, 8, 16


def main(backend: str, out_path: str) -> None:
    dist.init_process_group(backend)  # before Accelerator(): it then uses this group
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)
    rank, world = accelerator.process_index, accelerator.num_processes
    x = torch.randn(world * STEPS * BATCH, FEATURES, generator=torch.Generator().manual_seed(1))
    y = x.sum(dim=1, keepdim=True).sin()
    for step in range(STEPS):  # rank r takes the r-th slice of each global batch
        start = (step * world + rank) * BATCH
        loss = torch.nn.functional.mse_loss(model(x[start:start + BATCH]), y[start:start + BATCH])
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
    backend_class = type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__
    if rank == 0:
        final = {k: v.detach().clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}
        torch.save({"initial": initial, "final": final, "backend_class": backend_class,
                    "wrapped": type(model).__name__}, out_path)
    accelerator.wait_for_everyone()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
