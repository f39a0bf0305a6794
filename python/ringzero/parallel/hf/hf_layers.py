"""The modules parallelize() puts into a Hugging Face decoder: attention and MLP built on
tensor_parallel/tensor.py's column- and row-parallel layers, the vocabulary-parallel loss in transformers'
calling convention, and the hooks that shard the sequence between the decoder layers.

[Note: sequence parallelism in a Hugging Face model]
The model's own forward (LlamaModel, GPT2Model) derives positions, the rotary tables and the causal mask
from the embedding's output, and GPT-2 reshapes the final norm's output to the full sequence. So the
embedding stays replicated (B, T, d) and so do the final norm and everything after it; the sequence is
sharded only between the decoder layers: a pre-hook on the first layer keeps this rank's block
(split_to_sequence_shards) and a hook on the last one gathers it (gather_sequence_shards_replicated).
Inside, each layer's norms and residuals run on (B, T / tp, d) and the attention sees the whole
sequence after its column-parallel entry gathers it. Compared with Megatron (embedding reduce-scatter,
head all-gather) this costs one all-reduce of (B, T, d) at each end instead of a reduce-scatter.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ... import comm
from ..tensor_parallel.tensor import (ColumnParallelLinear, RowParallelLinear, gather_sequence_shards_replicated,
                                      group_size, split_to_sequence_shards)
from ..tensor_parallel.vocab import vocab_parallel_cross_entropy


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[-x2, x1] for x = [x1, x2] along the last dimension (the rotary convention of Llama's weights)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class ParallelAttention(nn.Module):
    """Causal self-attention with this rank's heads: heads / tp query heads and kv_heads / tp key/value
    heads (grouped-query attention: local query head i reads local key/value head i // (heads / kv_heads),
    as transformers' repeat_kv does globally). (B, T, d) -> (B, T, d) replicated, or (B, T / tp, d) ->
    (B, T / tp, d) with sequence parallelism.

    qkv: one ColumnParallelLinear whose rank-r shard is [q heads of r | k heads of r | v heads of r]
    (its chunks: the three blocks, cut by heads); out: the RowParallelLinear output projection. rotary: the model's rotary
    module, or None; held outside the module tree (the model owns it). forward takes the keywords a
    decoder layer passes (position_embeddings, attention_mask, ...) and returns (output, None) like
    transformers' attention modules. attention_mask: None (causal) or the 4-D mask transformers built
    for 'sdpa' (bool, True = attend) or 'eager' (additive float) over the whole sequence.
    """

    sources: dict = {}
    """What each parameter was made from (tensor_state.fused_sources), set by parallelize."""

    def __init__(self, qkv: ColumnParallelLinear, out: RowParallelLinear, heads: int, kv_heads: int, head_dim: int,
                 scaling: float, rotary: nn.Module | None):
        super().__init__()
        tp = qkv.tp
        self.qkv, self.out = qkv, out
        self.local_heads, self.local_kv_heads, self.head_dim = heads // tp, kv_heads // tp, head_dim
        self.scaling = scaling
        self._rotary = [rotary] if rotary is not None else []  # a list: not a submodule

    def forward(self, hidden_states: torch.Tensor, *args, attention_mask=None, position_embeddings=None,
                **kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is not None:
            raise ValueError("the tensor-parallel attention keeps no KV cache: call the model with use_cache=False")
        qkv = self.qkv(hidden_states)  # (B, T, (h + 2 kv) hd / tp): T is the whole sequence
        b, t = qkv.shape[:2]
        h, kv, hd = self.local_heads, self.local_kv_heads, self.head_dim
        q, k, v = qkv.split([h * hd, kv * hd, kv * hd], dim=-1)
        q, k, v = (z.reshape(b, t, -1, hd).transpose(1, 2) for z in (q, k, v))  # (B, heads, T, hd)
        if self._rotary:
            if position_embeddings is None:  # a pipeline stage: positions 0 .. T-1
                positions = torch.arange(t, device=q.device).unsqueeze(0)
                position_embeddings = self._rotary[0](q, positions)
            cos, sin = (z.unsqueeze(1) for z in position_embeddings)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            # Attention saves q, k and v for backward: q and k are new tensors now, and v as a view would keep
            # the whole fused q|k|v output alive; a copy of v holds only its kv / (h + 2 kv) share of it.
            v = v.contiguous()
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, is_causal=attention_mask is None,
                                           scale=self.scaling, enable_gqa=h != kv)
        return self.out(a.transpose(1, 2).reshape(b, t, h * hd)), None


class ParallelMLP(nn.Module):
    """down(act(gate(x)) * up(x)) (gated) or down(act(fc(x))) (plain) with this rank's intermediate
    columns: `up_in` is one ColumnParallelLinear (for a gated MLP chunks=2: [gate | up] of this rank),
    `down` the RowParallelLinear. Shapes as ParallelAttention's."""

    sources: dict = {}
    """What each parameter was made from (tensor_state.fused_sources), set by parallelize."""

    def __init__(self, up_in: ColumnParallelLinear, down: RowParallelLinear, act: nn.Module, gated: bool):
        super().__init__()
        self.up_in, self.down, self.act, self.gated = up_in, down, act, gated

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up_in(x)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            return self.down(self.act(gate) * up)
        return self.down(self.act(h))


def causal_lm_loss(local_logits: torch.Tensor, targets: torch.Tensor, group=None, ignore_index: int = -100,
                   num_items_in_batch=None) -> torch.Tensor:
    """Mean cross-entropy of vocabulary-parallel logits (B, T, V / tp) against targets (B, T) int64 (the
    next tokens, already shifted), skipping targets equal to ignore_index; with num_items_in_batch the
    sum divided by it instead (transformers' gradient-accumulation convention). group: the
    tensor-parallel group the vocabulary is split over (a group of one: ordinary cross-entropy). Every
    rank of the group calls it; every rank gets the same float32 scalar."""
    keep = targets != ignore_index
    per_token = vocab_parallel_cross_entropy(local_logits, targets.masked_fill(~keep, 0), group, reduction="none")
    total = (per_token * keep).sum()
    return total / (num_items_in_batch if num_items_in_batch is not None else keep.sum())


class HFCausalLMLoss:
    """The model's loss_function after parallelize: transformers' ForCausalLMLoss (labels shifted left by
    one, ignore_index -100) on vocabulary-parallel logits."""

    def __init__(self, group):
        self.group = group

    def __call__(self, logits, labels, vocab_size=None, num_items_in_batch=None, ignore_index: int = -100,
                 shift_labels=None, **kwargs):
        if shift_labels is None:
            shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(logits.device)
        return causal_lm_loss(logits.float(), shift_labels.to(logits.device), self.group, ignore_index,
                              num_items_in_batch)


def sum_gradient_over_group(param: nn.Parameter, group) -> None:
    """Makes backward sum `param`'s gradient over `group` before it is accumulated: a replicated
    parameter (a norm's weight) applied to this rank's sequence shard only ([Note: sequence-parallel
    gradients] in tensor_gpt.py). A tensor hook, not copy_to_tensor_region, because the norm's forward is
    transformers' own; it also runs before DDP's and ZeRO's post-accumulate hooks."""
    def hook(grad: torch.Tensor) -> torch.Tensor:
        out = grad.contiguous().clone()
        comm.all_reduce(out, group=group)
        return out

    param.register_hook(hook)


def zero_gradient_row(weight: nn.Parameter, row: int) -> None:
    """Keeps row `row` of `weight`'s gradient zero (nn.Embedding's padding_idx on the rank owning it)."""
    weight.register_hook(lambda grad: grad.index_fill(0, torch.tensor([row], device=grad.device), 0.0))


def shard_sequence_between(first: nn.Module, last: nn.Module, group) -> None:
    """[Note: sequence parallelism in a Hugging Face model]: `first` (the first decoder layer) takes this
    rank's block of its replicated input; `last`'s output is gathered to the whole sequence again."""
    def split_input(module, args, kwargs):
        if args:
            return (split_to_sequence_shards(args[0], group),) + tuple(args[1:]), kwargs
        return args, {**kwargs, "hidden_states": split_to_sequence_shards(kwargs["hidden_states"], group)}

    def gather_output(module, args, output):
        if isinstance(output, tuple):
            return (gather_sequence_shards_replicated(output[0], group),) + tuple(output[1:])
        return gather_sequence_shards_replicated(output, group)

    if group_size(group) > 1:
        first.register_forward_pre_hook(split_input, with_kwargs=True)
        last.register_forward_hook(gather_output)
