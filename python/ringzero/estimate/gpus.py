"""What one GPU of a kind computes per second: the constants of the step-time model, one set per kind.

Peak rates and memory bandwidth are NVIDIA's datasheet figures (dense 16-bit tensor-core FLOPs, no
sparsity; HBM bandwidth of the SXM part). The achieved fractions are ours: the share of peak that large
16-bit GEMMs reach, and the share of HBM bandwidth that elementwise kernels reach. For the A100 they were
chosen once for the whole Megatron-LM 2021 table (published.py), not per row; the H100 takes the same
fractions (no H100 row was used to set them). `ringzero estimate --gemm-fraction` overrides them.
"""
from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class GpuKind:
    """One GPU kind as the step-time model sees it."""

    name: str
    peak_flops_per_s: float
    """Dense 16-bit (bf16/fp16) tensor-core peak, FLOPs per second (datasheet)."""
    hbm_bytes_per_s: float
    """Memory bandwidth, bytes per second (datasheet)."""
    gemm_fraction: float = 0.76
    """Fraction of peak a large GEMM reaches (the asymptote of gemm_efficiency)."""
    gemm_half_width: float = 100.0
    """Per-rank matrix width at which a GEMM reaches half of gemm_fraction: the GEMM-size correction for the
    narrow matrices of tensor parallelism (efficiency = gemm_fraction x n / (n + gemm_half_width), n = the
    hidden size over tp). Narrow GEMMs run fewer, shorter tiles per wave and more of their time in the
    prologue and epilogue of each tile."""
    memory_fraction: float = 0.8
    """Fraction of hbm_bytes_per_s that elementwise kernels (norms, softmax, dropout, residuals) reach."""

    def __post_init__(self):
        for name in ("peak_flops_per_s", "hbm_bytes_per_s", "gemm_half_width"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
                raise ValueError(f"GpuKind.{name} must be a positive number, got {v!r}")
        for name in ("gemm_fraction", "memory_fraction"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 < v <= 1):
                raise ValueError(f"--{name.replace('_', '-')} must be in (0, 1], got {v!r}")

    def gemm_efficiency(self, width: float) -> float:
        """Fraction of peak a GEMM whose narrowest per-rank dimension is `width` reaches."""
        return self.gemm_fraction * width / (width + self.gemm_half_width)

    def gemm_s(self, flops: float, width: float) -> float:
        """Seconds of `flops` in GEMMs of per-rank width `width`."""
        return flops / (self.peak_flops_per_s * self.gemm_efficiency(width))

    def memory_s(self, nbytes: float) -> float:
        """Seconds to move `nbytes` through HBM in elementwise kernels."""
        return nbytes / (self.hbm_bytes_per_s * self.memory_fraction)

    def describe(self) -> str:
        return (f"{self.name}: {self.peak_flops_per_s / 1e12:.0f} TFLOP/s dense 16-bit peak, GEMMs at "
                f"{self.gemm_fraction:.0%} of it (half that at width {self.gemm_half_width:.0f}); "
                f"HBM {self.hbm_bytes_per_s / 1e12:.2f} TB/s at {self.memory_fraction:.0%}")


GPU_KINDS = {
    # A100 SXM4 80GB: 312 TFLOP/s bf16/fp16 dense; HBM2e 2,039 GB/s.
    "A100": GpuKind("A100", 312e12, 2.039e12),
    # H100 SXM5: 989 TFLOP/s bf16 dense; HBM3 3.35 TB/s.
    "H100": GpuKind("H100", 989e12, 3.35e12),
    # H200 SXM: the H100's tensor cores (989 TFLOP/s bf16 dense); HBM3e 4.8 TB/s.
    "H200": GpuKind("H200", 989e12, 4.8e12),
    # B200 (HGX B200): 2.25 PFLOP/s bf16 dense; HBM3e 8 TB/s.
    "B200": GpuKind("B200", 2.25e15, 8.0e12),
}
"""Every kind by the name of its cluster preset (network.PRESETS)."""


def gpu_kind(name: str, **overrides) -> GpuKind:
    """The kind named `name` (case-insensitive; a cluster name such as '1024xH100' names its kind), with
    any of GpuKind's fields overridden (None values are ignored). ValueError for an unknown name."""
    key = str(name).upper().split("X")[-1]
    if key not in GPU_KINDS:
        raise ValueError(f"GPU kind {name!r}: use one of {', '.join(GPU_KINDS)}")
    given = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(GPU_KINDS[key], **given) if given else GPU_KINDS[key]
