"""The model families `ringzero train --model` trains, and what every strategy needs from one, decided
here once (model_family) so that no run branches on the family:

    family = model_family(args)        # GPTFamily ('gpt'), MoEFamily ('moe') or HFFamily ('hf:llama', 'hf:gpt2',
                                       # 'hf:qwen2')
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
    family.moe_config                  # the models.MoEConfig of a mixture-of-experts model (its MoE blocks'
                                       # experts), None for a dense one: the expert-parallel runs need one

Every family's logits are over the whole byte vocabulary (256) in the same data, so the losses of
`--model gpt` and `--model hf:*` are the same quantity (models.lm_loss on full logits,
parallel.vocab_parallel_cross_entropy on a tensor-parallel rank's block).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..models import GPT, Block, GPTConfig, MoEConfig, MoEGPT

GPT_MODEL = "gpt"
MOE_MODEL = "moe"
HF_PREFIX = "hf:"
MODELS = (GPT_MODEL, MOE_MODEL, "hf:llama", "hf:gpt2", "hf:qwen2")
"""What --model accepts: ringzero's byte GPT (models.GPT, the default), its mixture-of-experts form
(models.MoEGPT: MoEFamily) or a transformers family built from a small random config
(models.hf.build_hf_model; needs `pip install ringzero[hf]`)."""
MOE_EXPERTS, MOE_TOP_K, MOE_EVERY = 8, 2, 2
"""--model moe's defaults: 8 experts per MoE block (--experts), each token to its top 2 (--top-k), every
other block a MoE block (Switch's layout: blocks 1, 3, ...)."""
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
    moe_config = None
    """The models.MoEConfig of a mixture-of-experts model, None for a dense one."""

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


class MoEFamily(GPTFamily):
    """models.MoEGPT: the byte GPT (--seq, --layers, --heads, --d-model, --recompute) whose every other block
    (MOE_EVERY) has a mixture of --experts GELU expert MLPs (default 8) instead of its MLP, each token sent
    to its --top-k (default 2), dropless, aux_loss_coef 0.01. An expert is half as wide as the dense MLP
    (2 * d_model), so that a token's top-2 experts cost what the GPT's MLP costs: the same compute per token
    as --model gpt with 8 / 2 = 4 times the MLP parameters in a MoE block (6.4M parameters at the default
    size against the GPT's 3.3M). Trained only by the expert-parallel runs (trainer/layout.check_run)."""

    name = MOE_MODEL

    def __init__(self, args):
        super().__init__(args)
        self.device = getattr(args, "device", "cpu")
        experts = getattr(args, "experts", None) or MOE_EXPERTS
        top_k = getattr(args, "top_k", None) or MOE_TOP_K
        try:
            self.moe_config = MoEConfig(experts=experts, top_k=top_k, every=MOE_EVERY, hidden=2 * args.d_model)
        except ValueError as e:
            raise ValueError(f"--model moe: {e} (--experts, --top-k)") from None
        if not any(self.moe_config.is_moe_layer(i) for i in range(args.layers)):
            raise ValueError(f"--model moe: --layers {args.layers} leaves no MoE block (block i is one when "
                             f"(i + 1) % {MOE_EVERY} == 0); use --layers {MOE_EVERY} or more")

    def check(self, layout, sequence_parallel: bool = False):
        """Refused: a number of ranks that does not divide the experts; CUDA (ringzero's all-to-all takes
        CPU tensors so far). Which strategies may train it is trainer/layout.check_run's rule."""
        if layout.expert_parallel and self.moe_config.experts % layout.ep:
            raise ValueError(f"{layout.strategy}: --experts {self.moe_config.experts} do not divide evenly over the "
                             f"{layout.ep} expert-parallel ranks (--nproc)")
        if self.device != "cpu":
            raise ValueError(f"--model moe runs on the CPU only so far (ringzero.all_to_all_single takes CPU tensors), "
                             f"not --device {self.device}")

    def build(self) -> nn.Module:
        torch.manual_seed(self.seed)
        return MoEGPT(self.config, self.moe_config)

    def estimate_model(self):
        """The estimator's shape of this model: the GPT's with its experts (estimate.MoE; parameter count
        equal to the model's); estimate_check gives the Plan its ep."""
        import dataclasses

        from ..estimate import ModelShape
        from ..estimate.moe import MoE

        moe = self.moe_config
        shape = ModelShape.from_gpt_config(self.config)
        return dataclasses.replace(shape, moe=MoE(experts=moe.experts, top_k=moe.top_k, expert_width=moe.hidden,
                                                  every=moe.every)), None


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
    --kv-heads, --recompute, --seed; --experts and --top-k for moe). ValueError for an unknown name or a shape
    the family cannot have; ImportError naming `pip install ringzero[hf]` for an hf model without transformers."""
    name = check_model_name(getattr(args, "model", GPT_MODEL))
    return {GPT_MODEL: GPTFamily, MOE_MODEL: MoEFamily}.get(name, HFFamily)(args)


__all__ = ["MODELS", "VOCAB", "ModelFamily", "GPTFamily", "MoEFamily", "HFFamily", "check_model_name",
           "free_parameters", "model_family"]
