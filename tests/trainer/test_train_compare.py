"""`ringzero train --compare` with the stock-torch rows on CPU (2 ranks, tiny model, 3 steps).

References: torch-ddp (torch.nn.parallel.DistributedDataParallel, torch.optim.AdamW) takes the same
steps as ringzero's ddp (FusedAdamW, the same AdamW), and torch-fsdp2 (fully_shard per block) the same
as ringzero's zero3: same seed, batches, warm-up and clip, so their losses agree up to summation
order and the optimizers' rounding (rel 1e-4). The printed table carries each ringzero row's ratio to
its torch row, results.json the raw numbers, and compare.png exists.
"""
import json

import pytest

from ringzero.cli import train
from train_cases import TINY


def test_torch_rows_beside_ours(tmp_path, capsys):
    out = tmp_path / "out"
    assert train.main([*TINY, "--compare", "ddp,torch-ddp,zero3,torch-fsdp2", "--steps", "3", "--val-every", "0",
                       "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    with open(out / "results.json") as f:
        by = {r["strategy"]: r for r in json.load(f)}
    assert list(by) == ["ddp", "torch-ddp", "zero3", "torch-fsdp2"]
    for ours, theirs in (("ddp", "torch-ddp"), ("zero3", "torch-fsdp2")):
        assert [v for _, v in by[ours]["train_losses"]] == pytest.approx([v for _, v in by[theirs]["train_losses"]],
                                                                        rel=1e-4), (ours, theirs)
        assert by[ours]["final_val_loss"] == pytest.approx(by[theirs]["final_val_loss"], rel=1e-4)
    for r in by.values():
        assert r["peak_mib_per_rank"] > 0 and r["tokens_per_s"] > 0 and r["step_ms"] > 0
    assert by["torch-ddp"]["comm_s"] is None and by["ddp"]["comm_s"] > 0
    lines = printed.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("strategy"))
    assert "vs" in lines[head] and "tok/s x" in lines[head] and "peak x" in lines[head]
    cols = [c.strip() for c in lines[head].split("|")]
    row = {line.split("|")[0].strip(): [c.strip() for c in line.split("|")] for line in lines[head + 1:head + 5]}
    assert row["ddp"][cols.index("vs")] == "torch-ddp" and row["zero3"][cols.index("vs")] == "torch-fsdp2"
    assert float(row["ddp"][cols.index("tok/s x")]) == pytest.approx(
        by["ddp"]["tokens_per_s"] / by["torch-ddp"]["tokens_per_s"], abs=0.006)
    assert "pred ms" in cols and all(r["pred_step_ms"] > 0 for r in by.values())  # CPU, float32: every row
    # The torch rows' collectives timed on their own gloo group; ringzero's rows keep the link's model.
    assert by["ddp"]["pred_measured_comm_ms"] is None and by["zero3"]["pred_measured_comm_ms"] is None
    assert list(by["torch-ddp"]["pred_measured_comm_ms"]) == ["gradients all-reduce"]
    fsdp2 = by["torch-fsdp2"]["pred_measured_comm_ms"]
    assert {"parameters all-gather, forward", "parameters all-gather, backward", "gradients reduce-scatter"} <= set(fsdp2)
    assert all(ms > 0 for r in ("torch-ddp", "torch-fsdp2") for ms in by[r]["pred_measured_comm_ms"].values())
    for r in by.values():  # each rank's prediction from its own core's rates; the step waits for the slower
        assert len(r["pred_step_ms_by_rank"]) == 2 and r["pred_step_ms"] == max(r["pred_step_ms_by_rank"])
    assert (out / "compare.png").exists()


def test_bf16_autocast_follows_float32(tmp_path):
    """--precision bf16 (the CUDA default) exercised on CPU autocast: the Autocast wrapper under DDP,
    under ZeRO-3's units and as a pipeline stage under ZeRO-1. Reference: the float32 run of the same
    seed; bf16 rounds activations to 8 mantissa bits, so the losses agree to 0.05 nats/byte."""
    def losses(precision):
        out = tmp_path / precision
        assert train.main([*TINY, "--compare", "ddp,zero3,pp+zero1", "--steps", "3", "--val-every", "0",
                           "--microbatches", "2", "--precision", precision, "--out", str(out)]) == 0
        with open(out / "results.json") as f:
            return {r["strategy"]: [v for _, v in r["train_losses"]] for r in json.load(f)}
    fp32, bf16 = losses("fp32"), losses("bf16")
    for name in fp32:
        assert bf16[name] == pytest.approx(fp32[name], abs=0.05), name
        assert bf16[name] != fp32[name], name  # autocast did change the arithmetic
