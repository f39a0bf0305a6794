"""Models used by the training job, the tests and the benchmarks."""
from .gpt import GPT, RECOMPUTE_KINDS, Block, Embedding, GPTConfig, Head, MoEBlock, MoEGPT, lm_loss
from .hf import build_hf_model
from .moe import MoEConfig, MoEFeedForward

__all__ = ["GPT", "GPTConfig", "Embedding", "Block", "Head", "lm_loss", "RECOMPUTE_KINDS", "build_hf_model",
           "MoEConfig", "MoEFeedForward", "MoEBlock", "MoEGPT"]
