"""ringzero.checkpoint: save at world 4 (ZeRO-3, torch AdamW), load at worlds 2 and 3 (ZeRO-1/2/3, DDP;
one of them into ringzero.optim.FusedAdamW) and continue with the
same losses as the uninterrupted world-4 run; consolidate gives the state_dict of one process training
the same steps (float64 torch.optim.AdamW reference, as in test_parallel_parity.py) and loads into the
plain module; the CLI writes the same tensors; an interrupted save (every rank stopped between writing
its shard and the manifest) leaves the previous checkpoint as the one that loads.

Loss tolerance: 1e-4 absolute (float32 runs at different world sizes reduce in different orders;
measured: at most 2.4e-7). State tolerance: as in test_parallel_parity.py (1e-3).
"""
import os
import subprocess
import sys

import torch

from harness import run_ranks
from parallel_cases import CLIP, LR, WD, batches, make_model, max_abs_error, reference

SAVE_AT, TOTAL = 2, 4
PY = os.path.join(os.path.dirname(__file__), "..", "..", "python")


def make_wrapped(kind, stage=None):
    from ringzero.models import Block
    from ringzero.parallel import DistributedDataParallel, ZeroDataParallel
    model = make_model()
    if kind == "ddp":
        return DistributedDataParallel(model)
    return ZeroDataParallel(model, stage=stage, unit=Block if stage == 3 else None, bucket_cap_mb=0.02)


GLOBAL = 12  # samples per step: divisible by every world size used here (2, 3, 4)


def data_all():
    return batches(GLOBAL // 2, TOTAL)  # (TOTAL, 1, GLOBAL, seq_len + 1)


def split(batch, rank, world):
    per = GLOBAL // world
    x = batch[rank * per:(rank + 1) * per]
    return x[:, :-1], x[:, 1:]


def steps(model, opt, data, rank, world, first, last):
    """Trains steps [first, last); returns the whole-batch loss of each (mean over ranks, with gloo)."""
    import torch.distributed as dist

    from ringzero.models import lm_loss
    losses = []
    for k in range(first, last):
        x, y = split(data[k, 0], rank, world)
        loss = lm_loss(model(x), y)
        loss.backward()
        model.clip_grad_norm_(CLIP)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    t = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(t)
    return (t / world).tolist()


def save_run(rank, world, root):
    from ringzero import checkpoint
    model = make_wrapped("zero", 3)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    first = steps(model, opt, data_all(), rank, world, 0, SAVE_AT)
    checkpoint.save(root, model, opt, step=SAVE_AT, extra={"note": "after two steps"})
    return first + steps(model, opt, data_all(), rank, world, SAVE_AT, TOTAL)


def resume_run(rank, world, root, kind, stage, fused=False):
    import ringzero
    from ringzero import checkpoint
    model = make_wrapped(kind, stage)
    make = ringzero.optim.FusedAdamW if fused else torch.optim.AdamW  # torch AdamW's state loads in either
    opt = make(model.parameters(), lr=LR * 3, weight_decay=0.0)  # hyperparameters overwritten by load
    info = checkpoint.load(root, model, opt)
    assert info["step"] == SAVE_AT and info["extra"] == {"note": "after two steps"}
    assert opt.param_groups[0]["lr"] == LR and opt.param_groups[0]["weight_decay"] == WD
    return steps(model, opt, data_all(), rank, world, SAVE_AT, TOTAL)


def test_save_world4_resume_world2_and_3_and_consolidate(tmp_path):
    root = str(tmp_path / "ckpt")
    uninterrupted = run_ranks(4, save_run, root)[0]
    for world, kind, stage, fused in [(2, "zero", 2, False), (3, "zero", 3, False), (2, "ddp", None, False),
                                      (3, "zero", 1, True)]:
        resumed = run_ranks(world, resume_run, root, kind, stage, fused)[0]
        diffs = [abs(a - b) for a, b in zip(resumed, uninterrupted[SAVE_AT:])]
        assert len(resumed) == TOTAL - SAVE_AT and max(diffs) <= 1e-4, (world, kind, stage, resumed, uninterrupted)
        print(f"resumed at world {world} ({kind} stage {stage}): max loss difference {max(diffs):.2e}")

    from ringzero import checkpoint
    state = checkpoint.consolidate(root)
    base = make_model()
    want, _, _ = reference(base, data_all()[:SAVE_AT])
    assert set(state) == set(base.state_dict())
    assert max_abs_error(state, want) <= 1e-3
    plain = make_model(seed=5)
    plain.load_state_dict(state, strict=True)
    assert all(torch.equal(p, state[n]) for n, p in plain.named_parameters())

    out = str(tmp_path / "full.pt")
    env = dict(os.environ, PYTHONPATH=PY + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-m", "ringzero.checkpoint", "consolidate", root, out], check=True, env=env,
                   timeout=120, capture_output=True)
    from_cli = torch.load(out, weights_only=True)
    assert from_cli.keys() == state.keys() and all(torch.equal(from_cli[k], state[k]) for k in state)


def interrupted_save(rank, world, root):
    from ringzero import checkpoint
    model = make_wrapped("zero", 2)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    steps(model, opt, data_all(), rank, world, 0, 1)
    checkpoint.save(root, model, opt, step=1)
    steps(model, opt, data_all(), rank, world, 1, 2)

    class Killed(Exception):
        pass

    def die():
        raise Killed()
    # Every rank stops after its shard is on disk and before the manifest: the files are left exactly
    # as a kill at that point would leave them (the harness cannot wait for ranks that os._exit).
    checkpoint._before_commit = die
    try:
        checkpoint.save(root, model, opt, step=2)
    except Killed:
        return "interrupted"
    finally:
        checkpoint._before_commit = None
    raise AssertionError("the save was meant to be interrupted")


def load_after_crash(rank, world, root):
    from ringzero import checkpoint
    model = make_wrapped("zero", 2)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    info = checkpoint.load(root, model, opt)
    return info["step"], str(info["path"])


def test_interrupted_save_is_never_loaded(tmp_path):
    root = tmp_path / "ckpt"
    assert run_ranks(2, interrupted_save, str(root)) == ["interrupted", "interrupted"]
    assert (root / "step-00000001" / "manifest.json").is_file()
    partial = root / ".tmp-step-00000002"
    assert partial.is_dir() and not (partial / "manifest.json").exists()
    assert not (root / "step-00000002").exists()
    got = run_ranks(2, load_after_crash, str(root))
    assert [g[0] for g in got] == [1, 1] and got[0][1].endswith("step-00000001")
    from ringzero import checkpoint
    try:
        checkpoint.latest(tmp_path / "nothing-here")
    except FileNotFoundError as e:
        assert "no complete checkpoint" in str(e)
    else:
        raise AssertionError("latest() of an empty path must raise FileNotFoundError")
