"""Layer 7: parallelism on top of ringzero's collectives (mesh, DDP, ZeRO, pipeline)."""
from . import pipeline
from .mesh import Mesh

__all__ = ["Mesh", "pipeline"]
