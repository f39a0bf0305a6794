"""`ringzero train` with tensor parallelism (tp, tp+zero1, 3d), through the trainer's own code path, on
CPU with a tiny model (4 heads, so tp = 1, 2 and 4 all divide it).

References:
- losses: the `ddp` strategy's on the same seed and batches (DDP's clip and losses are checked against
  one process on the whole batch in test_parallel_parity.py and test_train.py). The clip is set to 0.05
  so that every step clips: a wrong norm would change every later loss. Tolerance: rel 2e-4, abs 2e-4
  on every train loss, test_train.py's bound for DDP against ZeRO (float32, the tensor-parallel sums
  add in another order) [measured here: at most 4.8e-7].
- clipping of a tensor-parallel model under ZeRO-1 and under DDP (tensor_state.clip_tensor_parallel_grad_norm_):
  torch.nn.utils.clip_grad_norm_ on the unsplit GPT's whole-batch gradient, to half its norm: the norm
  returned and every clipped gradient element this rank holds, rtol 1e-5, atol 1e-6 (test_tensor_parallel.py's).
- checkpoints: a tp=2 run saved after 3 steps and resumed at tp=1 (tp strategy, 2 replicas), at tp=4
  (tp+zero1) and as plain ddp: every resumed step's loss (the first one computed on the loaded
  weights, the next ones after loaded optimizer state) against the uninterrupted tp=2 run, rel and abs
  1e-5 [measured: at most 4.8e-7]; consolidate gives the plain GPT's state_dict.
- bad layouts: refused by the command line before any rank is spawned, with the flag in the message.
"""
import json

import pytest
import torch
import torch.distributed as dist

from harness import run_ranks
from ringzero.cli import train
from train_cases import TINY

TP_TINY = [*TINY, "--heads", "4", "--clip", "0.05", "--val-every", "0"]
LOSS_TOL = dict(rel=2e-4, abs=2e-4)
RESUME_TOL = dict(rel=1e-5, abs=1e-5)


def run(out, *extra):
    assert train.main([*TP_TINY, "--out", str(out), *extra]) == 0
    with open(out / "results.json") as f:
        return {r["strategy"]: r for r in json.load(f)}


def losses(r):
    return [loss for _, loss in r["train_losses"]]


def test_tp_tp_zero1_and_3d_match_ddp_at_4_ranks(tmp_path):
    by = run(tmp_path / "out", "--nproc", "4", "--compare", "ddp,tp,tp+zero1,3d", "--tp", "2", "--pp", "2",
             "--microbatches", "2", "--steps", "5")
    ref = losses(by["ddp"])
    for name in ("tp", "tp+zero1", "3d"):
        assert by[name]["tp"] == 2 and by[name]["estimate_mib_per_rank"] > 0
        got = losses(by[name])
        print(name, "max loss difference to ddp", max(abs(a - b) for a, b in zip(got, ref)))
        assert got == pytest.approx(ref, **LOSS_TOL), name


def test_tp_with_sequence_parallelism_matches_ddp_at_2_ranks(tmp_path):
    by = run(tmp_path / "out", "--nproc", "2", "--compare", "ddp,tp", "--sequence-parallel", "--steps", "5")
    got, ref = losses(by["tp"]), losses(by["ddp"])
    print("max loss difference to ddp", max(abs(a - b) for a, b in zip(got, ref)))
    assert got == pytest.approx(ref, **LOSS_TOL)


def clip_cases(rank, world):
    """tp=2 x dp=2: clip_tensor_parallel_grad_norm_ over ZeRO-1 and over DDP against torch's clip."""
    from ringzero.models import GPT, GPTConfig, lm_loss
    from ringzero.parallel import (DistributedDataParallel, Mesh, ZeroDataParallel, tensor_parallel_gpt,
                                   vocab_parallel_cross_entropy)
    from ringzero.parallel.tensor_parallel.tensor_state import clip_tensor_parallel_grad_norm_, shard_of, shard_specs

    cfg = GPTConfig(vocab_size=60, seq_len=12, n_layer=2, n_head=4, d_model=32, mlp_ratio=2)
    mesh = Mesh(dp=2, tp=2)
    t, d = mesh.index("tp"), mesh.index("dp")
    torch.manual_seed(0)
    full = GPT(cfg)
    batch = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len + 1), generator=torch.Generator().manual_seed(1))
    lm_loss(full(batch[:, :-1]), batch[:, 1:]).backward()
    max_norm = 0.5 * float(torch.nn.utils.get_total_norm([p.grad for p in full.parameters()]))
    want_norm = torch.nn.utils.clip_grad_norm_(full.parameters(), max_norm)
    model = tensor_parallel_gpt(full, mesh.group("tp"))
    specs = shard_specs(model)

    def expected(name):
        g = full.get_parameter(name).grad
        return shard_of(g, *specs[name], 2, t) if name in specs else g

    mine = batch[2 * d:2 * d + 2]
    checked = 0
    for wrapper in ("zero1", "ddp"):
        m = tensor_parallel_gpt(full, mesh.group("tp"))
        wrapped = (ZeroDataParallel(m, stage=1, process_group=mesh.group("dp")) if wrapper == "zero1"
                   else DistributedDataParallel(m, process_group=mesh.group("dp")))
        vocab_parallel_cross_entropy(wrapped(mine[:, :-1]), mine[:, 1:], mesh.group("tp")).backward()
        if wrapper == "zero1":
            norm = clip_tensor_parallel_grad_norm_(wrapped, max_norm, tp=2)
            for g in wrapped.groups:
                start, n = g.layout.shard_start, g.layout.shard_numel
                for slot in g.layout.slots:
                    a, b = max(slot.offset, start), min(slot.offset + slot.numel, start + n)
                    if a < b:
                        want = expected(slot.name).reshape(-1)[a - slot.offset:b - slot.offset]
                        torch.testing.assert_close(g.master.grad[a - start:b - start], want, rtol=1e-5, atol=1e-6)
                        checked += 1
        else:
            norm = clip_tensor_parallel_grad_norm_(m, max_norm, tp=2, replicas=2)
            for name, p in m.named_parameters():
                torch.testing.assert_close(p.grad, expected(name), rtol=1e-5, atol=1e-6)
                checked += 1
        torch.testing.assert_close(norm, want_norm.float(), rtol=1e-5, atol=1e-6)
    dist.barrier()
    return checked


def test_tensor_parallel_clip_under_zero1_and_ddp_equals_torch_clip_on_the_unsplit_model():
    checked = run_ranks(4, clip_cases)
    assert all(c > 0 for c in checked), checked


def test_checkpoint_saved_at_tp2_resumes_at_tp1_tp4_and_as_ddp(tmp_path):
    full = run(tmp_path / "full", "--nproc", "2", "--strategy", "tp", "--steps", "6")["tp"]
    ckpt = tmp_path / "ckpt"
    run(tmp_path / "save", "--nproc", "2", "--strategy", "tp", "--steps", "3", "--checkpoint-dir", str(ckpt),
        "--save-every", "3")
    assert sorted(p.name for p in (ckpt / "step-00000003").iterdir()) == [
        "manifest.json", "tp000-rank00000.pt", "tp001-rank00000.pt"]
    want = dict(full["train_losses"])
    for name, layout in [("tp1", ["--nproc", "2", "--strategy", "tp", "--tp", "1"]),
                         ("tp4", ["--nproc", "4", "--strategy", "tp+zero1", "--tp", "4"]),
                         ("ddp", ["--nproc", "2", "--strategy", "ddp"])]:
        r = next(iter(run(tmp_path / name, *layout, "--steps", "6", "--checkpoint-dir", str(ckpt),
                          "--resume").values()))
        assert r["start_step"] == 3 and [s for s, _ in r["train_losses"]] == [3, 4, 5], name
        diffs = [abs(loss - want[s]) for s, loss in r["train_losses"]]
        print(f"resumed as {name}: max loss difference {max(diffs):.2e}")
        for s, loss in r["train_losses"]:
            assert loss == pytest.approx(want[s], **RESUME_TOL), (name, s)

    from ringzero import checkpoint
    from ringzero.models import GPT, GPTConfig
    state = checkpoint.consolidate(ckpt)
    plain = GPT(GPTConfig(seq_len=32, n_layer=2, n_head=4, d_model=64))
    plain.load_state_dict(state, strict=True)


def test_bad_tensor_parallel_layouts_fail_before_spawning(capsys, monkeypatch):
    import ringzero.cli.launch

    def no_spawn(*a, **k):
        raise AssertionError("a rank was spawned for a layout that cannot work")

    monkeypatch.setattr(ringzero.cli.launch, "launch", no_spawn)
    cases = [(["--strategy", "tp", "--nproc", "4", "--tp", "3"], "--tp 3 must divide --nproc 4"),
             (["--strategy", "ddp", "--nproc", "2", "--tp", "2"], "--tp 2 needs a tensor-parallel strategy"),
             (["--strategy", "3d", "--nproc", "4", "--tp", "2", "--pp", "4", "--layers", "4"],
              "--pp 4 times --tp 2 must divide --nproc 4"),
             (["--strategy", "tp", "--nproc", "4", "--heads", "2"], "n_head=2 must be divisible by 4"),
             (["--strategy", "tp+zero1", "--nproc", "2", "--seq", "33", "--sequence-parallel"], "seq_len=33"),
             (["--strategy", "tp", "--nproc", "2", "--tp", "0"], "--tp must be at least 1")]
    for argv, message in cases:
        with pytest.raises(SystemExit):
            train.main(argv)
        assert message in capsys.readouterr().err, argv
