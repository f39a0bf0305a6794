"""ringzero: hand-written collectives, fused sharded Adam and parallel training for PyTorch.

    import torch.distributed as dist, ringzero
    dist.init_process_group("gloo")
    ringzero.all_reduce(t)                      # same arguments as torch.distributed.all_reduce
"""
from .comm import (CollectiveMismatch, CommError, CommTimeout, Communicator, ReduceOp, Work, all_gather_into_tensor,
                   all_gather_single, all_gather_v, all_reduce, all_to_all, all_to_all_single, barrier, broadcast,
                   comm_seconds, destroy_communicators, gather, get_communicator, reduce, reduce_scatter_single,
                   reduce_scatter_tensor, scatter)
from . import ops, optim
from .comm import backend_stats, empty, is_registered, patch, register_backend, unpatch

register_backend()  # makes torch.distributed.init_process_group("ringzero") work
from .parallel import DistributedDataParallel, ZeroDataParallel

# ringzero.checkpoint (save / load / consolidate) is imported on use: `from ringzero import checkpoint`
# (importing it here would make `python -m ringzero.checkpoint` warn about a double import).

__version__ = "0.1.0"

__all__ = [
    "ReduceOp", "Work", "CommError", "CommTimeout", "CollectiveMismatch", "Communicator", "get_communicator",
    "destroy_communicators", "comm_seconds", "all_reduce", "reduce_scatter_single", "reduce_scatter_tensor",
    "all_gather_single", "all_gather_into_tensor", "all_gather_v", "broadcast", "reduce", "barrier", "all_to_all_single",
    "all_to_all", "gather", "scatter", "ops", "optim",
    "patch", "unpatch", "backend_stats", "empty", "is_registered",
    "DistributedDataParallel", "ZeroDataParallel",
]
