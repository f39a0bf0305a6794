"""Shared pieces of the pipeline tests: the small GPT in float64, its data, the float64 loss and the
one-process reference (forward and backward of the unsplit model on the whole batch).
"""
import torch
import torch.nn.functional as F

from ringzero.models import GPT, GPTConfig

BATCH = 10
CFG = dict(vocab_size=64, seq_len=16, n_layer=6, n_head=2, d_model=16)  # 8 blocks: 8 stages at most
RTOL, ATOL = 1e-9, 1e-12
SCHEDULES = ["GPipe", "1F1B", "Interleaved1F1B", "ZBH1"]


def lm_loss(logits, targets):
    """Mean next-token cross-entropy in the logits' dtype (float64 here)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(**CFG)).double()


def data(step, seq_len):
    g = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, CFG["vocab_size"], (BATCH, seq_len + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def reference(seq_len):
    model = build()
    x, y = data(0, seq_len)
    loss = lm_loss(model(x), y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}
