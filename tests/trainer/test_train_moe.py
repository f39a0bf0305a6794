"""`ringzero train --model moe` with the expert-parallel rows ep, ep+zero1 and torch-ep (trainer/strategies.py's
ExpertParallelRun, baselines_expert.py), end to end through the command, on CPU with 2 ranks and a tiny
MoEGPT (2 layers, d_model 64: one MoE block of 8 experts, top-2, dropless), 4 steps, clip 0.05 so that
every step clips.

Reference: one process holding every expert (train_cases.one_process_moe_losses): the same model, batches,
FusedAdamW, warm-up and clip, each step's batch cut into the two ranks' slices with one forward per slice
(the load-balancing loss is per forward call, so this is what the ranks compute). Every step's
language-model loss (the table's train loss) and load-balancing loss of ep and ep+zero1 must be within
STEP_TOL relative of it (float32 rounding: summation order across ranks and ZeRO's flat shards), and
torch-ep's too (torch.optim.AdamW instead of FusedAdamW, torch's norm: the same arithmetic in another
order). The three rows then agree with each other within twice that. Also: the table's a2a column
(each row's all-to-all seconds, timed the same way around ringzero's and torch's exchange) and its ratio
to torch-ep; bad combinations of --model and strategies refused in one line before any rank starts.
"""
import json

import pytest

from ringzero.cli import train
from train_cases import TINY, one_process_moe_losses

STEP_TOL = 5e-6
"""Relative, per step (test_train_hf.py's bound for one-process parity)."""
MOE = [*TINY, "--model", "moe", "--steps", "4", "--clip", "0.05", "--val-every", "0"]
ROWS = ("ep", "ep+zero1", "torch-ep")


def gap(got, want):
    return max(abs(a - b) / abs(b) for a, b in zip(got, want))


def test_ep_rows_match_one_process_and_torch_ep(tmp_path, capsys):
    argv = [*MOE, "--compare", ",".join(ROWS)]
    assert train.main([*argv, "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    with open(tmp_path / "results.json") as f:
        by = {r["strategy"]: r for r in json.load(f)}
    assert list(by) == list(ROWS)
    want_lm, want_aux = one_process_moe_losses(argv, slices=2)
    for name in ROWS:
        lm, aux = [v for _, v in by[name]["train_losses"]], by[name]["train_aux_losses"]
        print(f"{name:<9} max relative gap to one process: lm {gap(lm, want_lm):.1e}, aux {gap(aux, want_aux):.1e}")
        assert len(lm) == len(aux) == len(want_lm) == 4, name
        assert gap(lm, want_lm) <= STEP_TOL and gap(aux, want_aux) <= STEP_TOL, (name, lm, want_lm, aux, want_aux)
    for name in ROWS[1:]:
        assert gap([v for _, v in by[name]["train_losses"]], [v for _, v in by["ep"]["train_losses"]]) <= 2 * STEP_TOL
    for name, r in by.items():
        assert r["model"] == "moe" and r["a2a_s"] > 0 and r["estimate_mib_per_rank"] > 0, name
    assert by["ep"]["comm_s"] > 0 and by["ep+zero1"]["comm_s"] > 0 and by["torch-ep"]["comm_s"] is None
    lines = printed.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("strategy"))
    cols = [c.strip() for c in lines[head].split("|")]
    assert "a2a s" in cols and "a2a x" in cols
    row = {line.split("|")[0].strip(): [c.strip() for c in line.split("|")] for line in lines[head + 1:head + 4]}
    assert row["ep"][cols.index("vs")] == "torch-ep" and row["ep+zero1"][cols.index("vs")] == "torch-ep"
    a2a_ratio = by["ep"]["a2a_s"] / by["torch-ep"]["a2a_s"]
    assert float(row["ep"][cols.index("a2a x")]) == pytest.approx(a2a_ratio, abs=0.006)
    assert any(line.startswith("train loss and val loss: the language-model cross-entropy") for line in lines)


@pytest.mark.parametrize("argv, says", [
    (["--model", "moe", "--strategy", "ddp"],
     "ddp cannot train --model moe: use an expert-parallel run (ep, ep+zero1, torch-ep)"),
    (["--model", "moe", "--compare", "ep,tp"], "tp cannot train --model moe"),
    (["--strategy", "ep"],
     "ep shards the experts of a mixture-of-experts model: add --model moe (--model gpt has none)"),
    (["--compare", "torch-ep"], "torch-ep shards the experts of a mixture-of-experts model: add --model moe"),
    (["--model", "moe", "--strategy", "ep+zero1", "--nproc", "3", "--batch", "6"],
     "ep+zero1: --experts 8 do not divide evenly over the 3 expert-parallel ranks (--nproc)"),
    (["--model", "moe", "--strategy", "ep", "--top-k", "9"],
     "--model moe: MoEConfig.top_k=9 must be at most experts=8"),
    (["--model", "moe", "--strategy", "ep", "--layers", "1"], "--layers 1 leaves no MoE block"),
    (["--strategy", "ddp", "--experts", "4"],
     "--experts and --top-k shape --model moe's experts; --model gpt has none"),
])
def test_bad_combinations_are_refused_in_one_line(argv, says, capsys):
    with pytest.raises(SystemExit):
        train.parse_args(argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error: " in err and says in err, err
