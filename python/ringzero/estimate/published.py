"""Published training runs with their layout and measured throughput: the step-time model's validation set
(tests/estimate/test_estimate_step_time.py compares every row; docs/estimate.md shows the table).

Each row holds what its source states (model shape, GPUs, tensor/pipeline/data-parallel sizes, global batch,
reported TFLOP/s per GPU) and, apart, what the source does not state and we assumed (`assumed`). No row
carries a constant of the model: every row of a GPU kind runs on the same GpuKind.
"""
from __future__ import annotations

import dataclasses

from ..parallel.layout import without_pipeline
from .model import ModelShape
from .network import Cluster, custom_cluster, parse_cluster
from .plan import Plan, Precision

MEGATRON_2021 = ("Narayanan et al. 2021, 'Efficient Large-Scale Language Model Training on GPU Clusters Using "
                 "Megatron-LM' (SC21), Table 1")
BLOOM = ("BigScience 2022, 'BLOOM: A 176B-Parameter Open-Access Multilingual Language Model' (sections 3.4-3.5: "
         "shape, 48 nodes of 8 A100 80GB, 4 Omni-Path 100 Gb/s links per node, tp 4 pp 12 dp 8, ZeRO-1, global "
         "batch 2048, micro-batch 2), and its training card: 'about 150 TFLOPs' per GPU")
LLAMA3 = ("Dubey et al. 2024, 'The Llama 3 Herd of Models', Table 4 (first row: 8,192 H100 GPUs, TP 8, CP 1, PP 16, "
          "DP 64, sequence 8,192, batch 32 per DP rank, 430 TFLOPs/GPU, 43% BF16 MFU) and Table 3 (the 405B shape)")


@dataclasses.dataclass(frozen=True)
class PublishedRun:
    """One published run."""

    name: str
    source: str
    shape: ModelShape
    gpus: int
    tp: int
    pp: int
    batch: int
    """Global batch, sequences per step."""
    reported_tflops_per_gpu: float
    counts_recompute: bool
    """True when the reported TFLOP/s count recomputation's FLOPs (Megatron 2021, BLOOM), False for model
    FLOPs (MFU-style)."""
    cluster: Cluster
    gpu: str = "A100"
    """The GPU kind (gpus.GPU_KINDS): every row of a kind runs on the same constants."""
    micro_batch: int = 1
    strategy: str = "pp"
    dtype: str = "float16"
    grad_dtype: str | None = None
    """The gradients' dtype where it differs from dtype (None: the same)."""
    recompute: str = "full"
    schedule: str = "1f1b"
    virtual_stages: int = 1
    sequence_parallel: bool = False
    assumed: str = ""
    """What the source leaves open and the row assumes."""

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    def plan(self) -> Plan:
        strategy = self.strategy if self.pp > 1 else without_pipeline(self.strategy)
        return Plan(strategy=strategy, world=self.gpus, pp=self.pp, tp=self.tp,
                    microbatches=self.batch // (self.dp * self.micro_batch), schedule=self.schedule,
                    virtual_stages=self.virtual_stages, recompute=self.recompute,
                    sequence_parallel=self.sequence_parallel)

    def precision(self) -> Precision:
        return Precision.for_dtype(self.dtype, grad_dtype=self.grad_dtype)


def _megatron(params_b: str, heads: int, hidden: int, layers: int, tp: int, pp: int, gpus: int, batch: int,
              tflops: float) -> PublishedRun:
    shape = ModelShape(n_layer=layers, d_model=hidden, n_head=heads, vocab_size=51200, seq_len=2048,
                       tied_embeddings=True)
    return PublishedRun(f"GPT {params_b} (Megatron 2021)", MEGATRON_2021, shape, gpus, tp, pp, batch, tflops,
                        counts_recompute=True, cluster=parse_cluster(f"{gpus}xA100")[0],
                        assumed="micro-batch 1, 1F1B, full recomputation (the paper's FLOP count includes it), "
                                "fp16 gradients, the A100 preset's links (Selene: DGX A100, 8 x 200 Gb/s HDR)")


MEGATRON_TABLE1 = [
    # params, heads, hidden, layers, t, p, GPUs, batch, achieved TFLOP/s per GPU
    _megatron("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137),
    _megatron("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138),
    _megatron("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142),
    _megatron("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135),
    _megatron("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138),
    _megatron("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140),
    _megatron("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148),
    _megatron("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155),
    _megatron("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163),
    _megatron("1008.0B", 160, 25600, 128, 8, 64, 3072, 3072, 163),
]

BLOOM_176B = PublishedRun(
    "BLOOM-176B", BLOOM,
    ModelShape(n_layer=70, d_model=14336, n_head=112, vocab_size=250680, seq_len=2048, positions="rotary",
               tied_embeddings=True),
    gpus=384, tp=4, pp=12, batch=2048, reported_tflops_per_gpu=150, counts_recompute=True,
    cluster=custom_cluster(intra_gbps=2400, inter_gbps=100, latency_us=5, gpus_per_node=8, gpu_mem_gb=80,
                           nics_per_node=4),
    micro_batch=2, strategy="pp+zero1", dtype="bfloat16", grad_dtype="float32",
    assumed="float32 gradients (DeepSpeed's bf16 optimizer accumulates and reduces them in float32), full recomputation (Megatron-DeepSpeed's --checkpoint-activations), 1F1B, NVLink at the A100's 300 GB/s "
            "per direction; ALiBi has no position table (counted as 'rotary': no parameters)")

LLAMA3_405B = PublishedRun(
    "Llama 3 405B", LLAMA3,
    ModelShape(n_layer=126, d_model=16384, n_head=128, kv_heads=8, vocab_size=128256, seq_len=8192, mlp_width=53248,
               mlp="swiglu", norm="rms", positions="rotary", bias="none", dropout=False, attention="flash"),
    gpus=8192, tp=8, pp=16, batch=2048, reported_tflops_per_gpu=430, counts_recompute=False,
    cluster=parse_cluster("8192xH100")[0], gpu="H100", strategy="pp+zero1", dtype="bfloat16", recompute="none",
    sequence_parallel=True, schedule="interleaved", virtual_stages=2,
    assumed="micro-batch 1, no recomputation, sequence parallelism, an interleaved schedule of 2 chunks per rank "
            "(the paper interleaves and does not state the chunks; 1F1B without them predicts 13% lower), "
            "the H100 preset's links (400 Gb/s per GPU)")

PUBLISHED_RUNS = MEGATRON_TABLE1 + [BLOOM_176B, LLAMA3_405B]
"""Every row the validation compares."""
