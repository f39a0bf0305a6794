"""ringzero.estimate for transformers models (ModelShape.from_hf_config), against the models themselves.

- Parameters: the shape's count equals the built model's, for Llama (with and without grouped-query
  attention), Qwen2 (q, k, v biases) and GPT-2 (tied head, learned positions).
- Activations: what one decoder layer keeps for backward, counted as autograd sees it (saved-tensor hooks,
  each storage once, parameters left out), against layer_activation_bytes. The formula leaves out the
  per-row statistics (RMSNorm's and LayerNorm's rstd, attention's logsumexp) and the rotary tables, as
  Korthikanti et al. do; at these sizes they are under 1% of a layer.
- End to end: `ringzero train` at its default size (4 layers, d 256, batch 16 x 128) on 2 ranks, every
  rank's peak of live tensor bytes within 15% of the estimate for its stage (issue 34's bar), for the
  strategies whose memory differs in kind (replicated, sharded, staged, split by tensor, recomputed).
"""
import json

import pytest
import torch

from ringzero.cli import train
from reference import saved_bytes

try:
    import transformers  # noqa: F401
    HAVE_HF = True
except ImportError:
    HAVE_HF = False
pytestmark = pytest.mark.skipif(not HAVE_HF, reason="the hf models need transformers (pip install ringzero[hf])")

SHAPES = [("llama", None), ("llama", 2), ("qwen2", 2), ("gpt2", None)]


def shape_and_model(family, kv_heads, layers=2, d_model=128, heads=4, seq=64, device=None):
    from ringzero.estimate import ModelShape
    from ringzero.models.hf import build_hf_model, hf_config

    kwargs = dict(layers=layers, d_model=d_model, heads=heads, kv_heads=kv_heads, vocab=256, seq=seq)
    config, _ = hf_config(family, **kwargs)
    with torch.device(device or "cpu"):
        model = build_hf_model(family, **kwargs, seed=0)
    return ModelShape.from_hf_config(config, seq), model


@pytest.mark.parametrize("family, kv_heads", SHAPES)
def test_parameter_count_is_the_models(family, kv_heads):
    shape, model = shape_and_model(family, kv_heads, layers=3, device="meta")
    assert shape.n_params() == sum(p.numel() for p in model.parameters()), shape.describe()


def saved_by_one_layer(family, kv_heads, parallel=False):
    """(shape, bytes autograd saves in one decoder layer's forward, the formula's leftovers) for a batch of
    4; parallel: the layer as parallelize makes it (a tensor-parallel group of one)."""
    from ringzero.parallel import Mesh
    from ringzero.parallel.hf.hf_pipeline import hf_as_sequential
    from ringzero.parallel.hf.parallelize import parallelize

    shape, model = shape_and_model(family, kv_heads)
    if parallel:
        parallelize(model, Mesh(tp=1), plan=family)
    seq = hf_as_sequential(model, None if parallel else family)
    batch = 4
    tokens = torch.randint(0, 256, (batch, shape.seq_len), generator=torch.Generator().manual_seed(0))
    hidden = seq[0](tokens)
    counted = saved_bytes(lambda: seq[1](hidden), model)
    # What the formula leaves out, float32: the two norms' per-row statistics (rstd; LayerNorm: mean too),
    # attention's logsumexp per head and row, and the rotary cos and sin tables (s x head size each).
    sb, head_size = shape.seq_len * batch, shape.d_model // shape.n_head
    stats = 2 * (1 if shape.norm == "rms" else 2) * sb + shape.n_head * sb
    stats += 2 * shape.seq_len * head_size if shape.positions == "rotary" else 0
    return shape, counted, 4 * stats


@pytest.mark.parametrize("family, kv_heads", SHAPES)
def test_layer_activations_are_what_autograd_saves(family, kv_heads):
    shape, counted, stats = saved_by_one_layer(family, kv_heads)
    formula = shape.layer_activation_bytes(4, 4)
    print(f"{family} kv_heads {kv_heads}: saved {counted} bytes, formula {formula} + statistics {stats}")
    assert formula <= counted <= formula + stats, (shape.describe(), counted, formula, stats)


def parallel_layers_save(rank, world):
    return {f"{family} {kv_heads}": saved_by_one_layer(family, kv_heads, parallel=True)[1:]
            for family, kv_heads in SHAPES}


def test_tensor_parallel_layers_save_what_the_formula_says():
    """parallelize's layers (q, k, v fused in one column-parallel linear; gate and up fused) keep what the
    transformers layers keep: v is copied out of the fused output after the rotary, so that the fused
    output is not kept whole for v's sake (it was: (h + k) sbh more per layer, 11% of tp's peak)."""
    from harness import run_ranks

    got = run_ranks(1, parallel_layers_save, timeout_s=120)[0]
    for family, kv_heads in SHAPES:
        shape, _ = shape_and_model(family, kv_heads, device="meta")
        counted, stats = got[f"{family} {kv_heads}"]
        formula = shape.layer_activation_bytes(4, 4)
        print(f"parallel {family} kv_heads {kv_heads}: saved {counted} bytes, formula {formula} + statistics {stats}")
        assert formula <= counted <= formula + stats, (shape.describe(), counted, formula, stats)


def peaks_against_estimate(tmp_path, model_flags, runs, extra=()):
    out = tmp_path / "out"
    assert train.main(["--nproc", "2", *model_flags, "--compare", runs, *extra, "--steps", "3", "--val-every", "0",
                       "--no-progress", "--out", str(out)]) == 0
    with open(out / "results.json") as f:
        results = json.load(f)
    assert [r["strategy"] for r in results] == runs.split(",")
    for r in results:
        assert r["estimate_note"] is None
        for rank, (measured, predicted) in enumerate(zip(r["peak_mib_by_rank"], r["estimate_mib_by_rank"])):
            print(f"{' '.join(model_flags)} {r['strategy']:<9} {' '.join(extra):<16} rank {rank}: measured "
                  f"{measured:6.1f} MiB, estimated {predicted:6.1f} MiB, ratio {measured / predicted:.3f}")
            assert abs(measured / predicted - 1) <= 0.15, (r["strategy"], extra, rank, measured, predicted)


def test_llama_peaks_are_within_15_percent_of_the_estimate(tmp_path):
    llama = ["--model", "hf:llama", "--kv-heads", "2"]
    peaks_against_estimate(tmp_path / "plain", llama, "ddp,zero2,zero3,pp,tp,tp+zero1")
    peaks_against_estimate(tmp_path / "recompute", llama, "zero3,tp", ["--recompute", "full"])
    peaks_against_estimate(tmp_path / "sp", llama, "tp", ["--sequence-parallel"])


def test_gpt2_peaks_are_within_15_percent_of_the_estimate(tmp_path):
    peaks_against_estimate(tmp_path, ["--model", "hf:gpt2"], "zero1,pp,tp")
