"""Layer 6: fused optimizers (drop-in for torch.optim.Adam/AdamW) and the flat-shard step used by ZeRO."""
from .fused_adam import FusedAdam, FusedAdamW

__all__ = ["FusedAdam", "FusedAdamW"]
