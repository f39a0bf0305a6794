"""Tensor and sequence parallelism (parallel/tensor_parallel/: tensor.py, vocab.py, tensor_gpt.py) against the
unsplit GPT.

References, all computed in each rank's own process, sharing no code with the layers under test:
- one step: the full ringzero.models.GPT (same seed) on the same batch with lm_loss. The sharded model's
  loss and logits must equal the reference's (logits: this rank's vocabulary block), and each sharded
  parameter's gradient the slice of the reference's gradient that it holds (slices cut here with
  torch.chunk, not with the library's shard_rows); replicated parameters (layer norms, positions; under
  sequence parallelism also the row-parallel biases) the whole reference gradient. float32 throughout:
  rtol=1e-5, atol=1e-6 (the TP sums add partial products in another order) [measured on this machine:
  every element within 9% of atol + rtol * |reference|; largest absolute difference 1.4e-6].
  tp = 2, 3, 4 (the whole world) and tp = 2 inside a (dp=2 x tp=2) mesh, each with and without
  sequence parallelism. Then TensorParallelGPT.clip_grad_norm_ to half the norm: the norm returned must
  be torch.nn.utils.clip_grad_norm_'s on the reference, and the clipped gradients its slices (same
  tolerance).
- training: 3 AdamW steps of tp=2 x dp=2 (ringzero DDP over the data group) and of tp=2 with ZeRO-1 over
  the data group, with and without sequence parallelism, against parallel_cases.reference (one process,
  float64, torch.optim.AdamW on the whole global batch, no clipping); the shards after the steps must be
  the slices of the reference's parameters: max abs error <= 1e-3 and relative movement error <= 1e-3,
  the bounds of test_parallel_parity.py (float32 against float64 Adam) [measured: 4.2e-5 and 3.8e-5].
- vocab_parallel_cross_entropy: F.cross_entropy on the logits gathered with torch.distributed (gloo),
  loss and each rank's block of the gradient, rtol=1e-5, atol=1e-6, also with logits scaled to 1e4
  (exp overflows float32 without the max subtraction) and with every target on one rank.
- the layers' own initialisation (every rank seeded alike): exactly the slice of the full torch layer's.
- Mesh(pp, dp, tp): each axis's ranks against the formula rank = (pp_i * dp + dp_i) * tp + tp_i.
- bad arguments: ValueError (or TypeError) whose message names the argument.
Every random case prints its seed.
"""
import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from harness import run_ranks
from parallel_cases import LR, WD, max_abs_error, movement_error, reference

RTOL, ATOL = 1e-5, 1e-6
MODEL_SEED, DATA_SEED, LOGITS_SEED = 0, 1, 2
BATCH, STEPS = 4, 3


def config():
    from ringzero.models import GPTConfig
    # n_head, d_model * mlp_ratio, vocab_size and seq_len divisible by 2, 3 and 4.
    return GPTConfig(vocab_size=60, seq_len=12, n_layer=2, n_head=12, d_model=48, mlp_ratio=2)


def tokens(steps=1, batch=BATCH):
    print(f"data seed {DATA_SEED}")
    g = torch.Generator().manual_seed(DATA_SEED)
    return torch.randint(0, config().vocab_size, (steps, 1, batch, config().seq_len + 1), generator=g)


def full_model():
    from ringzero.models import GPT
    print(f"model seed {MODEL_SEED}")
    torch.manual_seed(MODEL_SEED)
    return GPT(config())


def expected_shard(name: str, full: torch.Tensor, tp: int, r: int) -> torch.Tensor:
    """The part of the full model's tensor `name` that tensor rank r of tp holds."""
    if name.endswith(("qkv.weight", "qkv.bias")):  # [q | k | v], each split by heads
        return torch.cat([z.chunk(tp, dim=0)[r] for z in full.chunk(3, dim=0)])
    if name.startswith("gqa."):  # grouped-query [q | k | v]: q of 24 rows, k and v of 12, each split by heads
        q, k, v = full[:24], full[24:36], full[36:]
        return torch.cat([q.chunk(tp, dim=0)[r], k.chunk(tp, dim=0)[r], v.chunk(tp, dim=0)[r]])
    if name.endswith(("fc.weight", "fc.bias", "lm.weight", "tok.weight")):
        return full.chunk(tp, dim=0)[r]
    if name.endswith(("proj.weight", "out.weight")):
        return full.chunk(tp, dim=1)[r]
    return full


def one_step_parity(group, sequence_parallel: bool, label: str) -> int:
    from ringzero.models import lm_loss
    from ringzero.parallel import tensor_parallel_gpt
    tp, r = dist.get_world_size(group), dist.get_rank(group)
    batch = tokens()[0, 0]
    x, y = batch[:, :-1], batch[:, 1:]
    ref = full_model()
    ref_logits = ref(x)
    ref_loss = lm_loss(ref_logits, y)
    ref_loss.backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}

    model = tensor_parallel_gpt(ref, group, sequence_parallel=sequence_parallel)
    logits = model(x)
    loss = model.loss(x, y)
    loss.backward()
    torch.testing.assert_close(loss, ref_loss, rtol=RTOL, atol=ATOL, msg=lambda s: f"{label} loss: {s}")
    torch.testing.assert_close(logits, expected_shard("lm.weight", ref_logits.transpose(0, 2), tp, r).transpose(0, 2),
                               rtol=RTOL, atol=ATOL, msg=lambda s: f"{label} logits: {s}")
    checked = 0
    for name, p in model.named_parameters():
        want = expected_shard(name, ref_grads[name], tp, r)
        torch.testing.assert_close(p.grad, want, rtol=RTOL, atol=ATOL, msg=lambda s: f"{label} {name}: {s}")
        checked += 1
    assert checked == len(ref_grads)
    # Clipping to half the full gradient's norm: shards summed over the group, replicated parameters once.
    max_norm = 0.5 * float(torch.nn.utils.get_total_norm(list(ref_grads.values())))
    ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm)
    norm = model.clip_grad_norm_(max_norm)
    torch.testing.assert_close(norm, ref_norm, rtol=RTOL, atol=ATOL, msg=lambda s: f"{label} clip norm: {s}")
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected_shard(name, ref_grads[name], tp, r), rtol=RTOL, atol=ATOL,
                                   msg=lambda s: f"{label} {name} after clipping: {s}")
    if sequence_parallel:
        assert len(model.sequence_parallel_parameters()) == 2 * 3 * config().n_layer + 2 + 1
    return checked


def cross_entropy_parity(group) -> int:
    from ringzero.parallel import vocab_parallel_cross_entropy
    tp, r = dist.get_world_size(group), dist.get_rank(group)
    v, n = config().vocab_size, 24
    print(f"logits seed {LOGITS_SEED}")
    g = torch.Generator().manual_seed(LOGITS_SEED)
    base = torch.randn(n, v, generator=g)
    spread = torch.randint(0, v, (n,), generator=g)
    one_rank = torch.randint(0, v // tp, (n,), generator=g)  # every target on tensor rank 0
    cases = [(1.0, spread), (1e4, spread), (3.0, one_rank)]
    for scale, targets in cases:
        local = (base * scale).chunk(tp, dim=1)[r].clone().requires_grad_()
        loss = vocab_parallel_cross_entropy(local, targets, group)
        loss.backward()
        parts = [torch.empty_like(local) for _ in range(tp)]
        dist.all_gather(parts, local.detach(), group=group)
        gathered = torch.cat(parts, dim=1).requires_grad_()
        want = F.cross_entropy(gathered, targets)
        want.backward()
        assert torch.isfinite(loss), f"scale {scale}: loss {loss}"
        torch.testing.assert_close(loss, want, rtol=RTOL, atol=ATOL, msg=lambda s: f"cross-entropy x{scale}: {s}")
        torch.testing.assert_close(local.grad, gathered.grad.chunk(tp, dim=1)[r], rtol=RTOL, atol=ATOL,
                                   msg=lambda s: f"cross-entropy x{scale} gradient: {s}")
    return len(cases)


def layers_initialise_as_sliced_full_layers(group) -> int:
    """Seeded alike, each layer holds its slice of what the full torch layer draws from that seed."""
    from ringzero.parallel import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
    tp, r = dist.get_world_size(group), dist.get_rank(group)
    cases = [(ColumnParallelLinear, (8, 36), dict(chunks=3), "qkv.weight", "qkv.bias"),
             (ColumnParallelLinear, (8, 48), dict(chunks=(24, 12, 12)), "gqa.weight", "gqa.bias"),
             (ColumnParallelLinear, (8, 12), {}, "fc.weight", "fc.bias"),
             (RowParallelLinear, (12, 8), {}, "out.weight", "out.bias"),
             (VocabParallelEmbedding, (12, 8), {}, "tok.weight", None)]
    for layer, sizes, kwargs, weight_name, bias_name in cases:
        torch.manual_seed(3)
        full = (torch.nn.Embedding if layer is VocabParallelEmbedding else torch.nn.Linear)(*sizes)
        torch.manual_seed(3)
        got = layer(*sizes, group=group, **kwargs)
        assert torch.equal(got.weight, expected_shard(weight_name, full.weight.detach(), tp, r)), (layer, kwargs)
        if bias_name:
            assert torch.equal(got.bias, expected_shard(bias_name, full.bias.detach(), tp, r)), (layer, kwargs)
    return len(cases)


def check_mesh_axes(mesh, pp, dp, tp):
    rank = dist.get_rank()
    p, d, t = rank // (dp * tp), rank // tp % dp, rank % tp
    assert (mesh.index("pp"), mesh.index("dp"), mesh.index("tp")) == (p, d, t), (rank, mesh)
    assert mesh.ranks("tp") == [(p * dp + d) * tp + i for i in range(tp)]
    assert mesh.ranks("dp") == [(p * dp + i) * tp + t for i in range(dp)]
    assert mesh.ranks("pp") == [(i * dp + d) * tp + t for i in range(pp)]
    for axis, size in (("pp", pp), ("dp", dp), ("tp", tp)):
        assert dist.get_world_size(mesh.group(axis)) == size == mesh.size(axis), (axis, size)


def train_and_compare(mesh, wrapper: str, sequence_parallel: bool) -> str:
    """STEPS AdamW steps of tensor_parallel_gpt over mesh tp, data over mesh dp; returns a summary."""
    from ringzero.parallel import DistributedDataParallel, ZeroDataParallel, tensor_parallel_gpt, vocab_parallel_cross_entropy
    tp_group, dp_group = mesh.group("tp"), mesh.group("dp")
    tp, r, dp, d = mesh.size("tp"), mesh.index("tp"), mesh.size("dp"), mesh.index("dp")
    base = full_model()
    data = tokens(STEPS)
    want, _, _ = reference(base, data, clip=None)
    model = tensor_parallel_gpt(copy.deepcopy(base), tp_group, sequence_parallel=sequence_parallel)
    init = {n: expected_shard(n, p.detach(), tp, r) for n, p in base.named_parameters()}
    if wrapper == "ddp":
        wrapped = DistributedDataParallel(model, process_group=dp_group)
    else:
        wrapped = ZeroDataParallel(model, stage=1, process_group=dp_group)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=LR, weight_decay=WD)
    per = BATCH // dp
    for step in data:
        batch = step[0, d * per:(d + 1) * per]
        vocab_parallel_cross_entropy(wrapped(batch[:, :-1]), batch[:, 1:], tp_group).backward()
        opt.step()
        opt.zero_grad()
    if wrapper == "zero1":
        wrapped.gather_params()
    got = dict(model.named_parameters())
    want = {n: expected_shard(n, p.detach(), tp, r) for n, p in want.items()}
    err, move = max_abs_error(got, want), movement_error(got, want, init)
    label = f"tp={tp} x dp={dp} {wrapper} sequence_parallel={sequence_parallel}"
    assert err <= 1e-3 and move <= 1e-3, f"{label}: max error {err:.3g}, movement {move:.3g}"
    return f"{label}: max error {err:.2e}, movement {move:.2e}"


def parity_cases(rank, world):
    from ringzero.parallel import Mesh
    done = {}
    for sp in (False, True):
        done[f"tp={world} sp={sp}"] = one_step_parity(None, sp, f"tp={world} sp={sp} rank {rank}")
    done["cross-entropy"] = cross_entropy_parity(None)
    done["initialisation"] = layers_initialise_as_sliced_full_layers(None)
    if world == 4:
        for pp, dp, tp in ((1, 2, 2), (2, 1, 2), (2, 2, 1), (1, 1, 4)):
            check_mesh_axes(Mesh(pp=pp, dp=dp, tp=tp), pp, dp, tp)
        mesh = Mesh(dp=2, tp=2)
        for sp in (False, True):
            done[f"tp=2 in 2x2 sp={sp}"] = one_step_parity(mesh.group("tp"), sp, f"tp=2 of 2x2 sp={sp} rank {rank}")
        done["cross-entropy tp=2"] = cross_entropy_parity(mesh.group("tp"))
        for wrapper in ("ddp", "zero1"):
            for sp in (False, True):
                done[f"{wrapper} sp={sp}"] = train_and_compare(mesh, wrapper, sp)
    return done


@pytest.mark.parametrize("world", [2, 3, 4])
def test_tensor_parallel_matches_unsplit_model(world):
    results = run_ranks(world, parity_cases, timeout_s=600)
    for r in results[1:]:
        assert r.keys() == results[0].keys()
    print(results[0])


def bad_arguments(rank, world):
    import torch.nn as nn

    from ringzero.models import GPT, GPTConfig
    from ringzero.parallel import (ColumnParallelLinear, Mesh, RowParallelLinear, VocabParallelEmbedding,
                                   tensor_parallel_gpt, vocab_parallel_cross_entropy)
    ok = GPTConfig(vocab_size=8, seq_len=4, n_layer=1, n_head=2, d_model=8, mlp_ratio=1)
    odd_seq = GPT(GPTConfig(vocab_size=8, seq_len=5, n_layer=1, n_head=2, d_model=8, mlp_ratio=1))
    checks = [
        (lambda: tensor_parallel_gpt(GPT(GPTConfig(vocab_size=8, n_head=3, d_model=12)), None), ValueError, "n_head=3"),
        (lambda: tensor_parallel_gpt(GPT(GPTConfig(vocab_size=9, n_head=2, d_model=8)), None), ValueError, "vocab_size=9"),
        (lambda: tensor_parallel_gpt(odd_seq, None, sequence_parallel=True), ValueError, "seq_len=5"),
        (lambda: tensor_parallel_gpt(GPT(ok), None, sequence_parallel=True)(torch.zeros(1, 3, dtype=torch.long)),
         ValueError, "T=3"),
        (lambda: tensor_parallel_gpt(nn.Linear(2, 2), None), TypeError, "model"),
        (lambda: ColumnParallelLinear(4, 7), ValueError, "out_features=7"),
        (lambda: ColumnParallelLinear(4, 9, chunks=3), ValueError, "chunks=3"),
        (lambda: ColumnParallelLinear(4, 9, chunks=(4, 2, 2)), ValueError, "must add up to out_features=9"),
        (lambda: RowParallelLinear(7, 4), ValueError, "in_features=7"),
        (lambda: VocabParallelEmbedding(7, 4), ValueError, "num_embeddings=7"),
        (lambda: vocab_parallel_cross_entropy(torch.zeros(3, 4), torch.zeros(2, dtype=torch.long)), ValueError, "targets"),
        (lambda: Mesh(tp=3), ValueError, "does not divide"),
        (lambda: Mesh(dp=1, tp=1), ValueError, "must equal the world size"),
        (lambda: Mesh(tp=0), ValueError, "tp must be a positive int"),
    ]
    for fn, exc, word in checks:
        with pytest.raises(exc, match=word):
            fn()
    # Without sequence parallelism an odd seq_len is fine.
    tensor_parallel_gpt(odd_seq, None)(torch.zeros(1, 5, dtype=torch.long))
    return len(checks)


def test_bad_arguments_raise_clear_errors():
    assert run_ranks(2, bad_arguments) == [14, 14]
