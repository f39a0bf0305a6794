"""Shared pieces of the DDP/ZeRO tests: the small model, the data, and the one-process reference.

The reference is one process training a float64 copy of the same initial model on the whole global
batch with torch.optim.AdamW (and torch.nn.utils.clip_grad_norm_), which shares no code with ringzero.
"""
import copy

import torch
import torch.nn as nn

from ringzero.models import GPT, GPTConfig, lm_loss

# Sizes chosen so that no flat group divides evenly by 2, 3 or 4 (61 tokens, width 35).
CFG = GPTConfig(vocab_size=61, seq_len=8, n_layer=2, n_head=5, d_model=35, mlp_ratio=2)
PER_RANK = 2
LR, WD, CLIP = 1e-2, 0.1, 0.5


class WithUnused(nn.Module):
    """The GPT plus a parameter that forward never uses (7 x 5 + 7 elements)."""

    def __init__(self):
        super().__init__()
        self.gpt = GPT(CFG)
        self.unused = nn.Linear(5, 7)

    def forward(self, idx):
        return self.gpt(idx)


def make_model(unused=False, seed=0):
    torch.manual_seed(seed)
    return WithUnused() if unused else GPT(CFG)


def batches(world, steps, micro=1, seed=1):
    """steps x micro global batches of (world * PER_RANK, seq_len + 1) tokens."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CFG.vocab_size, (steps, micro, world * PER_RANK, CFG.seq_len + 1), generator=g)


def local(batch, rank):
    x = batch[rank * PER_RANK:(rank + 1) * PER_RANK]
    return x[:, :-1], x[:, 1:]


def reference(model, data, unused_grad_zero=False, clip=CLIP):
    """One process, float64, whole batch: returns (named float64 params, clip norms, losses).
    clip=None: no clipping (the norms are then those of the unclipped gradients)."""
    ref = copy.deepcopy(model).double()
    opt = torch.optim.AdamW(ref.parameters(), lr=LR, weight_decay=WD)
    norms, losses = [], []
    for step in data:
        for batch in step:
            loss = lm_loss(ref(batch[:, :-1]), batch[:, 1:])
            loss.backward()
        losses.append(float(loss.detach()))
        if unused_grad_zero:  # ZeRO's rule: an unused parameter's share of the flat gradient is zero
            for p in ref.parameters():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        norms.append(float(torch.nn.utils.clip_grad_norm_(ref.parameters(), float("inf") if clip is None else clip)))
        opt.step()
        opt.zero_grad()
    return dict(ref.named_parameters()), norms, losses


def movement_error(got: dict, want: dict, init: dict) -> float:
    """||(got - init) - (want - init)|| / ||want - init|| over all parameters (float64)."""
    num = den = 0.0
    for n, w in want.items():
        d_ref = w.detach().double() - init[n].double()
        d_got = got[n].detach().double() - init[n].double()
        num += float((d_got - d_ref).pow(2).sum())
        den += float(d_ref.pow(2).sum())
    return (num / den) ** 0.5


def max_abs_error(got: dict, want: dict) -> float:
    return max(float((got[n].detach().double() - w.detach()).abs().max()) for n, w in want.items())
