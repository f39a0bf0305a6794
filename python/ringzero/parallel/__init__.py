"""Layer 7: parallelism on top of ringzero's collectives (mesh, DDP, ZeRO, pipeline)."""
from . import pipeline
from .ddp import DistributedDataParallel
from .mesh import Mesh
from .zero import ZeroDataParallel, zero_memory_formula

__all__ = ["Mesh", "DistributedDataParallel", "ZeroDataParallel", "zero_memory_formula", "pipeline"]
