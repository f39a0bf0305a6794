"""The model families `ringzero train --model` trains, and what every strategy needs from one, decided
here once (model_family) so that no run branches on the family:

    family = model_family(args)        # GPTFamily ('gpt') or HFFamily ('hf:llama', 'hf:gpt2', 'hf:qwen2')
    family.check(layout, sequence_parallel)  # ValueError, before any rank starts, for what it refuses
    model = family.build()             # the whole model, float32 on the CPU, the same weights on every rank
    model = model.to(device)           # (the caller's)
    module = family.module(model)      # what data-parallel runs wrap: forward(idx) -> logits (B, T, vocab)
    sharded = family.tensor_parallel(model, mesh, sequence_parallel)
                                       # this rank's shards: forward(idx) -> logits (B, T, vocab / tp); the
                                       # full `model` is not usable afterwards (its weights are freed or moved)
    seq = family.sequential(module)    # nn.Sequential(embedding, *layers, head) for pipeline.split (module:
                                       # from module() or tensor_parallel(); shares its parameters)
    family.block                       # the layer class: ZeRO-3 / FSDP2 units
    family.is_layer(m)                 # m is a layer (of module() or tensor_parallel()): layers per stage
    family.name                        # the --model name
    family.grad_sync(model, stages)    # the PipelineRunner's grad_sync (an embedding tied to the head), or None
    family.estimate_model()            # what ringzero.estimate is given for this model, and a note or None
    family.checkpoint_note             # which runs can load each other's checkpoints, when not all can (or None)
    family.check_resume(saved, tp)     # ValueError when a checkpoint saved as `saved` (checkpoint_extra) cannot
                                       # resume at this tensor-parallel size

Every family's logits are over the whole byte vocabulary (256) in the same data, so the losses of
`--model gpt` and `--model hf:*` are the same quantity (models.lm_loss on full logits,
parallel.vocab_parallel_cross_entropy on a tensor-parallel rank's block).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..models import GPT, Block, GPTConfig

GPT_MODEL = "gpt"
HF_PREFIX = "hf:"
MODELS = (GPT_MODEL, "hf:llama", "hf:gpt2", "hf:qwen2")
"""What --model accepts: ringzero's byte GPT (models.GPT, the default) or a transformers family built
from a small random config (models.hf.build_hf_model; needs `pip install ringzero[hf]`)."""
VOCAB = 256
"""Bytes: the vocabulary of ringzero.data, for every family."""


def free_parameters(model: nn.Module, keep=()):
    """Drops the storage of `model`'s parameters but those in `keep` (a rank keeps only its own shards or
    pipeline stage, which may share a parameter with another stage: an embedding tied to the head)."""
    kept = {id(p) for p in keep}
    for p in model.parameters():
        if id(p) not in kept:
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)


class ModelFamily:
    """What every family shares: the checkpoint's record of the model, and the check of it on resume."""

    name: str
    checkpoint_note = None
    """Which runs load each other's checkpoints, when not all of them can (None: all can)."""

    def checkpoint_extra(self, tp: int) -> dict:
        """What a checkpoint records about the model it holds (the trainer saves it as `extra`)."""
        return {"model": self.name, "tp": tp}

    def check_resume(self, saved, tp: int):
        """ValueError for a checkpoint of another model. saved: its checkpoint_extra (None for one saved
        before the model was recorded: not checked); tp: the resuming run's tensor-parallel size."""
        if saved and saved.get("model", self.name) != self.name:
            raise ValueError(f"--resume: the checkpoint holds --model {saved['model']}, not {self.name}")


class GPTFamily(ModelFamily):
    """models.GPT from --seq, --layers, --heads, --d-model and --recompute. The tensor-parallel GPT keeps
    the GPT's parameter names, so every checkpointed run loads every other's, at any tp."""

    name = GPT_MODEL
    block = Block

    def __init__(self, args):
        if getattr(args, "kv_heads", None) not in (None, args.heads):
            raise ValueError(f"--kv-heads {args.kv_heads}: the byte GPT has no grouped-query attention "
                             "(hf:llama and hf:qwen2 have)")
        self.seed = getattr(args, "seed", 0)
        self.config = GPTConfig(seq_len=args.seq, n_layer=args.layers, n_head=args.heads, d_model=args.d_model,
                                recompute=getattr(args, "recompute", "none"))

    def check(self, layout, sequence_parallel: bool = False):
        """The tensor-parallel divisibility of the GPT (parallel.layout's rules)."""
        from ..parallel.layout import LayoutError

        if layout.tensor_parallel:
            try:
                layout.check_model(self.config, sequence_parallel)
            except LayoutError as e:
                raise ValueError(f"{layout.strategy} with --tp {layout.tp}: {e} (--heads, --d-model, --seq)") from None

    def build(self) -> nn.Module:
        torch.manual_seed(self.seed)
        return GPT(self.config)

    def module(self, model: nn.Module) -> nn.Module:
        return model

    def tensor_parallel(self, model: nn.Module, mesh, sequence_parallel: bool) -> nn.Module:
        from ..parallel import tensor_parallel_gpt

        sharded = tensor_parallel_gpt(model, mesh.group("tp"), sequence_parallel)
        free_parameters(model)  # this rank keeps its shards only
        return sharded

    def sequential(self, module: nn.Module) -> nn.Sequential:
        return module.as_sequential()

    def is_layer(self, module: nn.Module) -> bool:
        from ..parallel.tensor_parallel.tensor_gpt import TensorParallelBlock

        return isinstance(module, (Block, TensorParallelBlock))

    def grad_sync(self, model: nn.Module, stages):
        return None  # nothing is shared between stages

    def estimate_model(self):
        return self.config, None


class HFFamily(ModelFamily):
    """A transformers causal LM (models.hf.build_hf_model) of --layers, --d-model, --heads, --kv-heads,
    vocabulary VOCAB and --seq positions, trained as parallel.hf_as_sequential's nn.Sequential (positions
    0 .. T-1, causal mask: the model's own forward for this data). Tensor parallelism is
    parallel.parallelize with the family's plan; --recompute full recomputes each decoder layer
    (HFDecoderLayer); 'selective' (GPT's attention core) has no counterpart here and is refused."""

    block = None  # set in __init__: parallel.hf.hf_pipeline.HFDecoderLayer (needs transformers' import to have worked)

    def __init__(self, args):
        from ..models.hf import hf_config  # ImportError naming `pip install ringzero[hf]` without transformers
        from ..parallel.hf.hf_pipeline import HFDecoderLayer

        self.name, self.seed = args.model, getattr(args, "seed", 0)
        self.family = args.model[len(HF_PREFIX):]
        self.block = HFDecoderLayer
        self.recompute = getattr(args, "recompute", "none")
        self.kwargs = dict(layers=args.layers, d_model=args.d_model, heads=args.heads,
                           kv_heads=getattr(args, "kv_heads", None), vocab=VOCAB, seq=args.seq)
        self.config, _ = hf_config(self.family, **self.kwargs)  # ValueError for a shape the family cannot have

    @property
    def tied(self) -> bool:
        """The LM head shares the token embedding's weight (gpt2)."""
        return bool(getattr(self.config, "tie_word_embeddings", False))

    def check(self, layout, sequence_parallel: bool = False):
        """Refused: --recompute selective; a tp that the plan cannot split the model by (heads, key/value
        heads, vocabulary, MLP width; the sequence with --sequence-parallel); a tied embedding split over
        pipeline stages under ZeRO (see the message)."""
        from ..parallel.hf.hf_plans import PLANS, check_config

        if self.recompute == "selective":
            raise ValueError(f"--model {self.name}: --recompute selective recomputes the byte GPT's attention core, "
                             "which a transformers layer does not expose; use --recompute full (each decoder layer)")
        if layout.tensor_parallel:
            sp = bool(sequence_parallel)
            width = getattr(self.config, "intermediate_size", None) or getattr(self.config, "n_inner", None)
            try:
                check_config(self.config, PLANS[self.family], layout.tp, sp, seq_len=self.kwargs["seq"])
                if width % layout.tp:
                    raise ValueError(f"the MLP's intermediate size {width} is not divisible by the tensor-parallel "
                                     f"size {layout.tp}")
            except ValueError as e:
                raise ValueError(f"{layout.strategy} with --tp {layout.tp} on --model {self.name}: {e} (--heads, "
                                 "--kv-heads, --d-model, --seq)") from None

    def build(self) -> nn.Module:
        from ..models.hf import build_hf_model

        return build_hf_model(self.family, **self.kwargs, seed=self.seed)

    def module(self, model: nn.Module) -> nn.Module:
        from ..parallel.hf.hf_pipeline import hf_as_sequential

        return hf_as_sequential(model, self.family, recompute=self.recompute == "full")

    def tensor_parallel(self, model: nn.Module, mesh, sequence_parallel: bool) -> nn.Module:
        """parallelize(model, mesh) in place (the full weights are replaced by this rank's shards), as the
        nn.Sequential of module()."""
        from ..parallel.hf.hf_pipeline import hf_as_sequential
        from ..parallel.hf.parallelize import parallelize

        parallelize(model, mesh, plan=self.family, sequence_parallel=sequence_parallel)
        return hf_as_sequential(model, recompute=self.recompute == "full")

    def sequential(self, module: nn.Module) -> nn.Sequential:
        return module

    def is_layer(self, module: nn.Module) -> bool:
        return isinstance(module, self.block)

    def grad_sync(self, model: nn.Module, stages):
        """parallel.tied_embedding_sync when the head is tied to the embedding (None otherwise)."""
        if not self.tied:
            return None
        from ..parallel.hf.hf_pipeline import tied_embedding_sync

        return tied_embedding_sync(model, stages, plan=self.family)

    def estimate_model(self):
        """The estimator's shape of this transformers model (estimate.ModelShape.from_hf_config)."""
        from ..estimate import ModelShape

        return ModelShape.from_hf_config(self.config, self.kwargs["seq"]), None


def check_model_name(name: str) -> str:
    """`name` if --model accepts it; ValueError listing the names otherwise."""
    if name not in MODELS:
        raise ValueError(f"--model {name!r} is not a model; use one of {', '.join(MODELS)}")
    return name


def model_family(args):
    """The family of --model (args.model, default 'gpt') for these args (--seq, --layers, --d-model, --heads,
    --kv-heads, --recompute, --seed). ValueError for an unknown name or a shape the family cannot have;
    ImportError naming `pip install ringzero[hf]` for an hf model without transformers."""
    name = check_model_name(getattr(args, "model", GPT_MODEL))
    return GPTFamily(args) if name == GPT_MODEL else HFFamily(args)


__all__ = ["MODELS", "VOCAB", "ModelFamily", "GPTFamily", "HFFamily", "check_model_name", "free_parameters", "model_family"]
