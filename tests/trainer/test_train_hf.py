"""`ringzero train --model hf:llama / hf:gpt2` (trainer/models.py's HFFamily) through the trainer's own code
path (train.parse_args, then trainer.train_rank on every rank, as the command's spawned ranks do), on
CPU with tiny random models (2 layers, d_model 64, seq 32, batch 8, 4 steps).

Reference: the same command's one-process run (ddp on one rank: the whole batch, no communication) of
the same model, seed, data and steps. Every strategy's train loss at every step must be within 2e-3
relative of it (issue 34's bar), and here within STEP_TOL = 5e-6: the clip is 0.05 so that every step
clips, but AdamW is nearly blind to a uniformly scaled gradient, so a wrong global norm moves the loss
by little (counting gpt2's tied embedding twice on pp gave 8.9e-6 after 4 steps). Measured on this
machine (2026-11-27): at most 1.8e-7 (pytest -s prints each gap).
- 2 ranks, both models: ddp, zero1-3, pp, pp+zero1, pp+zero2, tp, tp+zero1; tp, pp and zero3 again with
  --recompute full. hf:llama has grouped-query attention (kv_heads 2); hf:gpt2 ties its LM head to the
  embedding (pp puts the two on different stages).
- 4 ranks, hf:llama: 3d (tp 2 x pp 2) with and without --recompute full, pp+zero2 with --pp 2; hf:gpt2:
  pp+zero1 and pp+zero2 with --pp 2, and 3d (the tied embedding on both stages, under ZeRO).
- checkpoints, hf:llama with kv_heads 4 (= heads) and 2 (grouped-query): saved by tp (tp = 2) after 3
  steps, resumed at tp = 1 (2 replicas) and as tp+zero1 at tp = 1: the resumed steps' losses against the
  uninterrupted tp = 2 run, rel and abs 1e-5 (test_train_tp.py's bound for the byte GPT). Both models: a
  tp checkpoint resumed by ddp and zero1, a ddp checkpoint resumed by tp = 2, against the uninterrupted runs.
- refusals before any rank starts: an unknown --model, an hf model without transformers (the message
  names `pip install ringzero[hf]`), --recompute selective.
"""
import sys

import pytest
import torch
import torch.distributed as dist

from harness import run_ranks
from ringzero.cli import train

try:
    import transformers  # noqa: F401
    HAVE_HF = True
except ImportError:
    HAVE_HF = False
needs_hf = pytest.mark.skipif(not HAVE_HF, reason="the hf models need transformers (pip install ringzero[hf])")

LOSS_BAR = 2e-3  # issue 34: every strategy within 2e-3 relative of the one-process loss
STEP_TOL = 5e-6  # what these runs hold to (see the docstring); 25 times the largest gap measured
RESUME_TOL = dict(rel=1e-5, abs=1e-5)
COMMON = ["--batch", "8", "--seq", "32", "--layers", "2", "--d-model", "64", "--heads", "4", "--steps", "4",
          "--clip", "0.05", "--microbatches", "2", "--val-every", "0", "--val-batches", "1", "--no-progress"]
MODELS = {"hf:llama": ["--model", "hf:llama", "--kv-heads", "2"], "hf:gpt2": ["--model", "hf:gpt2"]}
TWO_RANKS = [(s, "none") for s in ("ddp", "zero1", "zero2", "zero3", "pp", "pp+zero1", "pp+zero2", "tp", "tp+zero1")]
TWO_RANKS += [(s, "full") for s in ("tp", "pp", "zero3")]
FOUR_RANKS = [("3d", "none", []), ("3d", "full", []), ("pp+zero2", "none", ["--pp", "2"])]


def losses(summary):
    return [loss for _, loss in summary["train_losses"]]


def train_cases(rank, world, cases):
    """Each (name, argv, strategy) case through train_rank on this spawn's ranks; rank 0's summaries."""
    from ringzero.trainer import train_rank

    out = {}
    for name, argv, strategy in cases:
        summary = train_rank(train.parse_args([*argv, "--nproc", str(world), "--strategy", strategy]), strategy)
        out[name] = summary
    dist.barrier()
    return out if rank == 0 else None


@pytest.fixture(scope="module")
def reference():
    """The one-process run of each model."""
    cases = [(model, [*COMMON, *flags], "ddp") for model, flags in MODELS.items()]
    return run_ranks(1, train_cases, cases, timeout_s=300)[0]


def check_against(reference, model, name, summary):
    got, want = losses(summary), losses(reference[model])
    gap = max(abs(a - b) / abs(b) for a, b in zip(got, want))
    print(f"{model:<9} {name:<18} max relative loss gap to one process: {gap:.1e}")
    assert len(got) == len(want) and gap <= min(LOSS_BAR, STEP_TOL), (model, name, got, want)


@needs_hf
def test_every_strategy_on_two_ranks_matches_one_process(reference):
    cases = [(f"{model} {s} {r}", [*COMMON, *flags, "--recompute", r], s)
             for model, flags in MODELS.items() for s, r in TWO_RANKS]
    by = run_ranks(2, train_cases, cases, timeout_s=600)[0]
    for name, summary in by.items():
        model, strategy, recompute = name.split()
        assert summary["model"] == model and summary["recompute"] == recompute
        assert summary["estimate_note"] is None and summary["estimate_mib_per_rank"] > 0  # the model's shape
        check_against(reference, model, f"{strategy} {recompute}", summary)


@needs_hf
def test_3d_and_two_stage_zero_on_four_ranks_match_one_process(reference):
    """hf:gpt2's pp+zero1/2 over 2 stages and 3d: its tied embedding is on both, in a ZeRO bucket of its own
    whose reduced shards the two stages add (tied_embedding_sync), counted once by the clip."""
    cases = [(f"hf:llama {s} {r} {' '.join(extra)}", [*COMMON, *MODELS["hf:llama"], "--recompute", r, *extra], s)
             for s, r, extra in FOUR_RANKS]
    cases += [(f"hf:gpt2 {s} none --pp 2", [*COMMON, *MODELS["hf:gpt2"], "--pp", "2"], s) for s in ("pp+zero1", "pp+zero2")]
    cases += [("hf:gpt2 3d none ", [*COMMON, *MODELS["hf:gpt2"]], "3d")]
    by = run_ranks(4, train_cases, cases, timeout_s=600)[0]
    for name, summary in by.items():
        model, rest = name.split(" ", 1)
        check_against(reference, model, rest, summary)
    assert by["hf:llama 3d none "]["tp"] == 2


@needs_hf
@pytest.mark.parametrize("kv_heads", ["4", "2"])
def test_llama_checkpoint_saved_at_tp2_resumes_at_tp1(tmp_path, kv_heads):
    """kv_heads 2: grouped-query attention, whose fused [q | k | v] has a larger q block; the checkpoint
    records the three blocks' sizes, so it re-cuts them for another tp as it does equal ones."""
    ckpt = str(tmp_path / "ckpt")
    llama = [*COMMON, "--model", "hf:llama", "--kv-heads", kv_heads, "--steps", "6"]
    cases = [("full", llama, "tp"),
             ("save", [*llama, "--steps", "3", "--checkpoint-dir", ckpt, "--save-every", "3"], "tp"),
             ("tp1", [*llama, "--tp", "1", "--checkpoint-dir", ckpt, "--resume"], "tp"),
             ("tp+zero1 tp1", [*llama, "--tp", "1", "--checkpoint-dir", ckpt, "--resume"], "tp+zero1")]
    by = run_ranks(2, train_cases, cases, timeout_s=300)[0]
    want = dict(by["full"]["train_losses"])
    for name in ("tp1", "tp+zero1 tp1"):
        r = by[name]
        assert r["start_step"] == 3 and [s for s, _ in r["train_losses"]] == [3, 4, 5], name
        print(f"kv_heads {kv_heads}, resumed as {name}: max loss difference "
              f"{max(abs(l - want[s]) for s, l in r['train_losses']):.1e}")
        for s, loss in r["train_losses"]:
            assert loss == pytest.approx(want[s], **RESUME_TOL), (name, s)


@needs_hf
@pytest.mark.parametrize("model", MODELS)
def test_checkpoints_load_across_the_fused_and_the_transformers_form(tmp_path, model):
    """A tp checkpoint (q|k|v and gate|up fused, output projections renamed; GPT-2's Conv1D transposed)
    resumed by ddp and zero1 at 2 replicas, and a ddp checkpoint resumed by tp at tp = 2: the resumed
    steps' losses against the uninterrupted run of the same form."""
    flags = [*COMMON, *MODELS[model], "--steps", "6"]
    tp_ckpt, ddp_ckpt = str(tmp_path / "tp"), str(tmp_path / "ddp")
    cases = [("tp full", flags, "tp"), ("ddp full", flags, "ddp"),
             ("tp save", [*flags, "--steps", "3", "--checkpoint-dir", tp_ckpt, "--save-every", "3"], "tp"),
             ("ddp save", [*flags, "--steps", "3", "--checkpoint-dir", ddp_ckpt, "--save-every", "3"], "ddp"),
             ("ddp from tp", [*flags, "--checkpoint-dir", tp_ckpt, "--resume"], "ddp"),
             ("zero1 from tp", [*flags, "--checkpoint-dir", tp_ckpt, "--resume"], "zero1"),
             ("tp from ddp", [*flags, "--checkpoint-dir", ddp_ckpt, "--resume"], "tp")]
    by = run_ranks(2, train_cases, cases, timeout_s=300)[0]
    for name, reference in (("ddp from tp", "tp full"), ("zero1 from tp", "tp full"), ("tp from ddp", "ddp full")):
        r, want = by[name], dict(by[reference]["train_losses"])
        assert r["start_step"] == 3 and [s for s, _ in r["train_losses"]] == [3, 4, 5], name
        print(f"{model} {name}: max loss difference {max(abs(l - want[s]) for s, l in r['train_losses']):.1e}")
        for s, loss in r["train_losses"]:
            assert loss == pytest.approx(want[s], **RESUME_TOL), (name, s)
    # Consolidated offline, the tp checkpoint has the transformers form's names (the parts), as ddp's has.
    from ringzero.checkpoint import consolidate
    fused, plain = consolidate(tp_ckpt), consolidate(ddp_ckpt)
    assert sorted(fused) == sorted(plain) and not any(".qkv." in n or ".up_in." in n for n in fused)
    for n in plain:
        torch.testing.assert_close(fused[n], plain[n], rtol=1e-4, atol=1e-5, msg=n)


def refused(capsys, argv) -> str:
    with pytest.raises(SystemExit):
        train.parse_args(argv)
    return capsys.readouterr().err


def test_unknown_model_is_refused(capsys):
    err = refused(capsys, ["--model", "hf:nope"])
    assert "--model 'hf:nope' is not a model" in err and "hf:llama" in err


def test_hf_model_without_transformers_says_how_to_install_it(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    assert "pip install ringzero[hf]" in refused(capsys, ["--model", "hf:llama"])


@needs_hf
def test_what_hf_models_refuse(capsys):
    assert "use --recompute full" in refused(capsys, ["--model", "hf:llama", "--recompute", "selective"])
    assert "num_key_value_heads=3" in refused(capsys, ["--model", "hf:llama", "--heads", "6", "--kv-heads", "3",
                                                       "--d-model", "48", "--strategy", "tp", "--nproc", "2"])
    assert "no grouped-query attention" in refused(capsys, ["--model", "hf:gpt2", "--kv-heads", "2"])
    assert "byte GPT has no grouped-query" in refused(capsys, ["--kv-heads", "2"])
