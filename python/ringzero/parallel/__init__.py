"""Layer 7: parallelism on top of ringzero's collectives (mesh, DDP, ZeRO, tensor, pipeline, expert)."""
from . import pipeline
from .data_parallel.ddp import DistributedDataParallel
from .data_parallel.zero import ZeroDataParallel, zero_memory_formula
from .expert import ExpertDataParallel, ExpertParallelMoE, expert_parallel
from .hf.hf_pipeline import hf_as_sequential, hf_pipeline_loss, tied_embedding_sync
from .hf.hf_plans import PLANS, HFPlan
from .hf.parallelize import parallelize
from .mesh import Mesh
from .tensor_parallel.tensor import (ColumnParallelLinear, RowParallelLinear, copy_to_tensor_region,
                                     gather_from_sequence_shards, reduce_from_tensor_region,
                                     reduce_scatter_to_sequence_shards)
from .tensor_parallel.tensor_gpt import TensorParallelGPT, tensor_parallel_gpt
from .tensor_parallel.vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy

__all__ = ["Mesh", "DistributedDataParallel", "ZeroDataParallel", "zero_memory_formula", "pipeline",
           "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "vocab_parallel_cross_entropy",
           "copy_to_tensor_region", "reduce_from_tensor_region", "gather_from_sequence_shards",
           "reduce_scatter_to_sequence_shards", "TensorParallelGPT", "tensor_parallel_gpt",
           "parallelize", "HFPlan", "PLANS", "hf_as_sequential", "hf_pipeline_loss", "tied_embedding_sync",
           "ExpertParallelMoE", "expert_parallel", "ExpertDataParallel"]
