"""torch-tp: the model split over all ranks with DTensor's parallelize_module, ringzero's tp split written
with torch's own styles, as the like-for-like row of `tp` (and `tp+zero1`).

    byte GPT   embed.tok RowwiseParallel (vocabulary rows)   q, k, v ColwiseParallel (by heads)
               embed.pos, layer norms replicated              proj RowwiseParallel
               head.lm ColwiseParallel, logits Shard(-1)      fc ColwiseParallel, out RowwiseParallel
    llama/qwen2  embed_tokens Rowwise; q_proj, k_proj, v_proj Colwise (key/value heads split as ringzero's
               plan splits them); o_proj Rowwise; gate_proj, up_proj Colwise; down_proj Rowwise; norms
               replicated; lm_head Colwise
    loss       F.cross_entropy on the vocabulary-sharded logits under loss_parallel() (no full logits)

With --sequence-parallel the residual stream between regions is Shard(1) (SequenceParallel norms, the
regions' inputs all-gathered by PrepareModuleInput, the row-parallel outputs reduce-scattered). The
GPT's embedding enters that stretch by keeping its rank's slice of the summed embedding (ringzero
reduce-scatters there instead: one all-reduce of (B, T, d) against one reduce-scatter, once per step).
Every parameter is a DTensor (the unsplit ones Replicate), so torch.optim.AdamW and clip_grad_norm_
treat them as one model. The GPT's fused qkv is cut into q, k and v Linears (same weights), the
shape ColwiseParallel splits by heads. Ranks are all tensor-parallel (no replicas); --recompute is
ignored. GPT-2's fused Conv1D projections and a tied head have no torch style: refused.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..models import Block
from ..parallel.layout import Layout
from .baselines import device_mesh, torch_adamw
from .models import model_family
from .run import RankEnv, RunCheckpoint, compute_module, set_lr
from .strategies import DataParallelRun


class _Attention(nn.Module):
    """Causal self-attention from separate q, k, v projections; heads read from the local width, so it
    computes this rank's heads when q, k, v are column-parallel: (B, T, d) -> (B, T, d)."""

    def __init__(self, block: Block):
        super().__init__()
        d = block.qkv.in_features
        self.head_dim = d // block.n_head
        self.q, self.k, self.v = (nn.Linear(d, d) for _ in range(3))
        with torch.no_grad():
            for lin, w, b in zip((self.q, self.k, self.v), block.qkv.weight.split(d), block.qkv.bias.split(d)):
                lin.weight.copy_(w)
                lin.bias.copy_(b)
        self.proj = block.proj

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t = h.shape[0], h.shape[1]
        q, k, v = (lin(h).view(b, t, -1, self.head_dim).transpose(1, 2) for lin in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(a.transpose(1, 2).reshape(b, t, -1))


class _MLP(nn.Module):
    def __init__(self, block: Block):
        super().__init__()
        self.fc, self.out = block.fc, block.out

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(h)))


class _SplitBlock(nn.Module):
    """models.Block's computation (pre-norm attention and MLP) with attention and MLP as submodules that
    the plan can prepare inputs for: (B, T, d) -> (B, T, d), a DTensor Shard(1) under sequence parallelism."""

    def __init__(self, block: Block):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = block.ln1, _Attention(block), block.ln2, _MLP(block)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class _EnterSequenceShards(nn.Module):
    """The GPT's embedding, its (replicated) output kept as this rank's slice of positions: DTensor Shard(1)."""

    def __init__(self, embed: nn.Module, mesh):
        super().__init__()
        self.embed, self.mesh = embed, mesh

    def forward(self, idx):
        from torch.distributed.tensor import DTensor, Replicate, Shard

        whole = DTensor.from_local(self.embed(idx), self.mesh, [Replicate()], run_check=False)
        return whole.redistribute(self.mesh, [Shard(1)])


def _gpt_plan(model: nn.Module, mesh, sp: bool) -> dict:
    """Restructures `model` (a models.GPT) into _SplitBlocks and returns its parallelize_module plan."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)

    model.blocks = nn.ModuleList(_SplitBlock(b) for b in model.blocks)
    plan = {"embed.tok": RowwiseParallel(input_layouts=Replicate()),
            "head.lm": ColwiseParallel(input_layouts=Shard(1) if sp else Replicate(), output_layouts=Shard(-1),
                                       use_local_output=False)}
    for i in range(len(model.blocks)):
        p = f"blocks.{i}."
        plan.update({p + "attn.q": ColwiseParallel(), p + "attn.k": ColwiseParallel(), p + "attn.v": ColwiseParallel(),
                     p + "mlp.fc": ColwiseParallel()})
        if sp:
            plan.update({p + "ln1": SequenceParallel(), p + "ln2": SequenceParallel(),
                         p + "attn": PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate()),
                         p + "mlp": PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate()),
                         p + "attn.proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
                         p + "mlp.out": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)})
        else:
            plan.update({p + "attn.proj": RowwiseParallel(), p + "mlp.out": RowwiseParallel()})
    if sp:
        plan["head.ln"] = SequenceParallel()
    return plan


def _llama_plan(model: nn.Module, mesh, sp: bool) -> dict:
    """The parallelize_module plan of a transformers Llama/Qwen2 ...ForCausalLM."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)

    plan = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1) if sp else
                                                  Replicate(), use_local_output=not sp),
            "lm_head": ColwiseParallel(input_layouts=Shard(1) if sp else Replicate(), output_layouts=Shard(-1),
                                       use_local_output=False)}
    shard_out = dict(output_layouts=Shard(1), use_local_output=False) if sp else {}
    for i in range(len(model.model.layers)):
        p = f"model.layers.{i}."
        plan.update({p + "self_attn.q_proj": ColwiseParallel(), p + "self_attn.k_proj": ColwiseParallel(),
                     p + "self_attn.v_proj": ColwiseParallel(), p + "self_attn.o_proj": RowwiseParallel(**shard_out),
                     p + "mlp.gate_proj": ColwiseParallel(), p + "mlp.up_proj": ColwiseParallel(),
                     p + "mlp.down_proj": RowwiseParallel(**shard_out)})
        if sp:
            gather = dict(input_kwarg_layouts={"hidden_states": Shard(1)},
                          desired_input_kwarg_layouts={"hidden_states": Replicate()})
            plan.update({p + "input_layernorm": SequenceParallel(), p + "post_attention_layernorm": SequenceParallel(),
                         p + "self_attn": PrepareModuleInput(**gather),
                         p + "mlp": PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate())})
    if sp:
        plan["model.norm"] = SequenceParallel()
    return plan


def _replicate_rest(model: nn.Module, mesh):
    """Every parameter not yet a DTensor becomes a Replicate one; its module takes and returns local
    tensors as before (a DTensor input, under sequence parallelism, is left as it is)."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_module, distribute_tensor

    def to_dtensor(module, inputs, mesh):
        return tuple(x if isinstance(x, DTensor) or not torch.is_tensor(x)
                     else DTensor.from_local(x, mesh, [Replicate()], run_check=False) for x in inputs)

    def to_local(module, output, mesh):
        return output.to_local() if isinstance(output, DTensor) else output

    def replicate(name, module, mesh):
        for n, p in list(module.named_parameters(recurse=False)):
            if not isinstance(p, DTensor):
                module.register_parameter(n, nn.Parameter(distribute_tensor(p.detach(), mesh, [Replicate()])))

    for module in list(model.modules()):
        if any(not isinstance(p, DTensor) for p in module.parameters(recurse=False)):
            distribute_module(module, mesh, replicate, input_fn=to_dtensor, output_fn=to_local)


class TorchTensorParallelRun(DataParallelRun):
    """The torch-tp row: see the module docstring. Every rank takes the whole batch (one replica)."""

    def __init__(self, model, opt, args, mesh):
        super().__init__(model, opt, args, replicas=1, replica=0)
        self.mesh = mesh

    @classmethod
    def check(cls, layout: Layout, schedule: str, family=None):
        """Refused: replicas beside the tensor group, or (when `family` is known) a model without a torch
        parallel style (GPT-2's fused Conv1D projections, a head tied to the embedding)."""
        if layout.dp != 1:
            raise ValueError(f"torch-tp splits over all ranks: --tp {layout.tp} with --nproc {layout.world} "
                             "leaves replicas")
        if family is not None and family.name != "gpt" and (family.name not in ("hf:llama", "hf:qwen2")
                                                            or family.tied):
            raise ValueError(f"torch-tp on --model {family.name}: fused Conv1D projections (gpt2) and a head tied "
                             "to the embedding have no torch parallel style; use hf:llama or hf:qwen2, untied")

    @classmethod
    def create(cls, layout: Layout, model, args, env: RankEnv) -> TorchTensorParallelRun:
        """Splits `model` (the --model family's, whole on every rank) in place over all ranks."""
        from torch.distributed.tensor.parallel import parallelize_module

        family = model_family(args)
        cls.check(layout, args.schedule, family)
        mesh = device_mesh(env.device.type, env.baseline_group)
        sp = bool(args.sequence_parallel)
        if family.name == "gpt":
            plan = _gpt_plan(model, mesh, sp)
        else:
            plan = _llama_plan(model, mesh, sp)
        parallelize_module(model, mesh, plan)
        _replicate_rest(model, mesh)
        module = model if family.name == "gpt" else family.module(model)
        if sp and family.name == "gpt":
            module.embed = _EnterSequenceShards(module.embed, mesh)
        module = compute_module(module, env)
        return cls(module, torch_adamw(model.parameters(), args), args, mesh)

    def _loss(self, x, y):
        from torch.distributed.tensor import DTensor

        logits = self.model(x)  # DTensor (B, T, vocab) sharded on the vocabulary
        assert isinstance(logits, DTensor), "torch-tp: the head must return sharded logits"
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())

    def clip(self, max_norm: float):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)

    def train_step(self, x, y, step: int) -> float:
        from torch.distributed.tensor.parallel import loss_parallel

        set_lr(self.opt, self.args.lr, step)
        with loss_parallel():
            loss = self._loss(x, y)
            loss.backward()
        if self.args.clip > 0:
            self.clip(self.args.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.full_tensor().item()

    @torch.no_grad()
    def val_loss(self, batches) -> float:
        from torch.distributed.tensor.parallel import loss_parallel

        with loss_parallel():
            losses = [self._loss(x, y).full_tensor().item() for x, y in batches]
        return sum(losses) / len(losses)

    def checkpoint(self) -> RunCheckpoint | None:
        return None
