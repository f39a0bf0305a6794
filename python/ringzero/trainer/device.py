"""Where a rank computes and how its tensors travel: the decisions, as pure functions of the machine
(unit-tested on CPU), and the one call that applies them in a freshly started rank.

  - rank to GPU: LOCAL_RANK when the host has a GPU per rank, else LOCAL_RANK % device_count (several
    ranks share a GPU; ringzero's CUDA collectives then go through CUDA IPC between the processes);
  - the default process group: gloo on CPU; on CUDA "cpu:gloo,cuda:nccl" when every rank has a GPU of
    its own and torch has NCCL (NCCL refuses two ranks on one GPU), else gloo (ringzero's collectives
    bootstrap over it; CUDA tensors never go through it);
  - the group for the stock-torch baselines (torch-ddp, torch-fsdp2): the default group, except on a
    shared GPU, where they run on the "ringzero" backend;
  - pipeline tensors: parallel.pipeline.transport.choose_transport.
"""
from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist

DEVICES = ("cpu", "cuda")
PRECISIONS = ("auto", "fp32", "bf16")


def rank_device(device_type: str, local_rank: int, device_count: int) -> torch.device:
    """This rank's device: cpu, or cuda:(local_rank % device_count)."""
    if device_type == "cpu":
        return torch.device("cpu")
    if device_type != "cuda":
        raise ValueError(f"device {device_type!r}: use one of {DEVICES}")
    if device_count < 1:
        raise ValueError("--device cuda: no CUDA device is visible to this rank")
    if local_rank < 0:
        raise ValueError(f"LOCAL_RANK must be >= 0, got {local_rank}")
    return torch.device("cuda", local_rank % device_count)


def gpu_shared(local_world: int, device_count: int) -> bool:
    """True when some GPU of this host holds more than one of its local_world ranks."""
    return local_world > device_count


def process_group_backend(device_type: str, shared: bool, nccl_available: bool) -> str:
    """The backend string of the default process group (see the module docstring)."""
    if device_type == "cuda" and not shared and nccl_available:
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def baseline_backend(device_type: str, shared: bool, nccl_available: bool) -> str | None:
    """The backend of a separate group for the stock-torch rows, or None to use the default group
    (gloo on CPU, its NCCL half on CUDA with a GPU per rank). On a shared GPU: 'ringzero'."""
    if device_type == "cuda" and (shared or not nccl_available):
        return "ringzero"
    return None


def machine(device_type: str) -> dict:
    """What the decisions need, read from this process: local rank and world, GPUs, NCCL."""
    count = torch.cuda.device_count() if device_type == "cuda" else 0
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    return {"local_rank": int(os.environ.get("LOCAL_RANK", "0")), "local_world": local_world,
            "device_count": count, "shared": device_type == "cuda" and gpu_shared(local_world, count),
            "nccl": dist.is_available() and dist.is_nccl_available()}


def bind(device_type: str) -> tuple[torch.device, str]:
    """Called in a rank before init_process_group: selects its GPU (torch.cuda.set_device) and returns
    (device, backend of the default group)."""
    m = machine(device_type)
    device = rank_device(device_type, m["local_rank"], m["device_count"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device, process_group_backend(device_type, m["shared"], m["nccl"])


def precision_of(precision: str, device_type: str) -> str:
    """'auto' is bf16 on CUDA (bf16 autocast compute, float32 weights, masters, gradients and
    reductions) and fp32 on CPU (where bf16 matmuls are slow and the CPU tests want exact float32)."""
    if precision not in PRECISIONS:
        raise ValueError(f"--precision {precision!r}: use one of {PRECISIONS}")
    if precision == "auto":
        return "bf16" if device_type == "cuda" else "fp32"
    return precision


def autocast(device: torch.device, precision: str):
    """The compute context of forward passes: bf16 autocast, or nothing for fp32."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


class Autocast(torch.nn.Module):
    """Runs `module` under autocast(device, precision) and returns float32 (so that pipeline stage
    boundaries and the loss keep one dtype whatever the compute dtype). Parameters stay the module's."""

    def __init__(self, module: torch.nn.Module, device: torch.device, precision: str):
        super().__init__()
        self.module, self.device, self.precision = module, device, precision

    def forward(self, x):
        with autocast(self.device, self.precision):
            out = self.module(x)
        return out.float() if out.is_floating_point() else out
