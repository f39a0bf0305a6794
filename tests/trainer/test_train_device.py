"""`ringzero train`'s decisions, without starting any rank:

- rank to device (LOCAL_RANK when there are enough GPUs, LOCAL_RANK % device_count when ranks share),
  the default process group's backend, the group of the torch rows, the precision: each against a
  hand-written table of machines;
- checks before spawning: a bad --schedule (the advertised-but-wrong ZeroBubbleH1 included), a schedule
  the trainer cannot run, a schedule's own microbatch rule, each fail in parse_args with the valid names,
  and no rank is started (launch is replaced by a function that fails the test);
- the layout rules are one: the estimator's Plan and the trainer raise the same LayoutError rule;
- report.ratios: each ringzero row over its matching torch row, computed by hand.
"""
import pytest
import torch

from ringzero.cli import train
from ringzero.trainer import device, ratios, table
from ringzero.trainer.layout import check_run


@pytest.mark.parametrize("local_rank, count, want", [
    (0, 1, "cuda:0"), (1, 1, "cuda:0"), (3, 1, "cuda:0"),   # one GPU: every rank shares it
    (0, 4, "cuda:0"), (3, 4, "cuda:3"),                      # a GPU per rank: LOCAL_RANK
    (2, 2, "cuda:0"), (3, 2, "cuda:1"),                      # 4 ranks on 2 GPUs: two per GPU
])
def test_rank_to_gpu(local_rank, count, want):
    assert device.rank_device("cuda", local_rank, count) == torch.device(want)


def test_rank_device_on_cpu_and_errors():
    assert device.rank_device("cpu", 5, 0) == torch.device("cpu")
    with pytest.raises(ValueError, match="no CUDA device"):
        device.rank_device("cuda", 0, 0)
    with pytest.raises(ValueError, match="use one of"):
        device.rank_device("tpu", 0, 1)


@pytest.mark.parametrize("dev, local_world, count, nccl, shared, backend, baseline", [
    ("cpu", 2, 0, True, False, "gloo", None),
    ("cuda", 2, 1, True, True, "gloo", "ringzero"),              # 2 ranks on one GPU: IPC, no NCCL
    ("cuda", 2, 2, True, False, "cpu:gloo,cuda:nccl", None),     # a GPU each: NCCL
    ("cuda", 8, 8, False, False, "gloo", "ringzero"),            # torch without NCCL
    ("cuda", 4, 2, True, True, "gloo", "ringzero"),
])
def test_backends(dev, local_world, count, nccl, shared, backend, baseline):
    got_shared = dev == "cuda" and device.gpu_shared(local_world, count)
    assert got_shared == shared
    assert device.process_group_backend(dev, got_shared, nccl) == backend
    assert device.baseline_backend(dev, got_shared, nccl) == baseline


def test_precision():
    assert device.precision_of("auto", "cpu") == "fp32"
    assert device.precision_of("auto", "cuda") == "bf16"
    assert device.precision_of("fp32", "cuda") == "fp32"
    with pytest.raises(ValueError, match="precision"):
        device.precision_of("fp8", "cuda")


@pytest.fixture
def no_spawn(monkeypatch):
    import ringzero.cli.launch

    def fail(*args, **kwargs):
        raise AssertionError("a rank was spawned")
    monkeypatch.setattr(ringzero.cli.launch, "launch", fail)


@pytest.mark.parametrize("argv, message", [
    (["--strategy", "pp", "--schedule", "ZeroBubbleH1"], "'ZeroBubbleH1' is not a schedule; use one of GPipe, 1F1B, ZBH1"),
    (["--strategy", "ddp", "--schedule", "gpipe"], "use one of GPipe, 1F1B, ZBH1"),
    (["--strategy", "pp", "--schedule", "Interleaved1F1B"], "one stage per rank"),
    (["--strategy", "pp+zero1", "--nproc", "4", "--schedule", "ZBH1"], "splits the backward"),
    (["--strategy", "pp", "--microbatches", "1"], "needs num_microbatches >= num_ranks"),
    (["--compare", "ddp,torch-ddp", "--checkpoint-dir", "/tmp/x", "--save-every", "2"], "not torch-ddp"),
    (["--compare", "ddp,torch-zero"], "unknown strategy ['torch-zero']"),
])
def test_bad_runs_fail_before_spawning(no_spawn, capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        train.main([*argv, "--no-progress"])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_zbh1_runs_in_float32_only():
    check_run("pp", 2, None, 8, 2, 2, "ZBH1", "fp32")
    with pytest.raises(ValueError, match="float32 only"):
        check_run("pp", 2, None, 8, 2, 2, "ZBH1", "bf16")


def test_one_layout_rule_for_trainer_and_estimator():
    from ringzero.estimate import Plan
    from ringzero.parallel.layout import LayoutError

    with pytest.raises(LayoutError) as est:
        Plan("pp", world=4, pp=3)
    with pytest.raises(ValueError, match="--pp 3 must divide --nproc 4") as run:
        check_run("pp+zero1", 4, 3, 12, 1, 4)
    assert est.value.key == "pp_divides_world" and isinstance(run.value.__context__, LayoutError)
    assert Plan("pp+zero2", world=4, pp=2).zero_stage == check_run("pp+zero2", 4, 2, 8, 2, 4).zero_stage == 2
    assert check_run("torch-fsdp2", 2, None, 8, 1, 2).zero_stage == 3  # a torch row takes its match's layout


@pytest.mark.parametrize("strategy, world, want", [
    # (pp, tp, dp, zero_stage, pipeline, tensor_parallel) with the default degrees, written by hand
    ("ddp", 4, (1, 1, 4, 0, False, False)), ("zero1", 4, (1, 1, 4, 1, False, False)),
    ("zero2", 4, (1, 1, 4, 2, False, False)), ("zero3", 4, (1, 1, 4, 3, False, False)),
    ("pp", 4, (4, 1, 1, 0, True, False)), ("pp+zero1", 4, (2, 1, 2, 1, True, False)),
    ("pp+zero2", 8, (4, 1, 2, 2, True, False)), ("tp", 4, (1, 4, 1, 0, False, True)),
    ("tp+zero1", 2, (1, 2, 1, 1, False, True)), ("3d", 8, (2, 2, 2, 1, True, True)),
])
def test_layout_holds_its_degrees_as_fields(strategy, world, want):
    """The name is read once, at construction: the degrees and the stage are stored fields (in the
    instance's __dict__), not properties that parse the name again."""
    from ringzero.parallel.layout import Layout

    layout = Layout.of(strategy, world)
    got = (layout.pp, layout.tp, layout.dp, layout.zero_stage, layout.pipeline, layout.tensor_parallel)
    assert got == want
    assert {"dp", "zero_stage", "pipeline", "tensor_parallel"} <= set(vars(layout))


@pytest.mark.parametrize("bad", ["pp+zero3", "PP", "", None])
def test_a_bad_strategy_name_says_which_argument_and_the_names(bad):
    from ringzero.parallel.layout import ALL_STRATEGIES, Layout, LayoutError

    with pytest.raises(LayoutError) as e:
        Layout.of(bad, 4)
    assert e.value.key == "strategy" and isinstance(e.value, ValueError)
    assert str(e.value) == f"strategy={bad!r}: use one of {', '.join(ALL_STRATEGIES)}"


def _row(name, tok, step, peak):
    return {"strategy": name, "tokens_per_s": tok, "step_ms": step, "peak_mib_per_rank": peak, "final_train_loss": 1.0,
            "final_val_loss": 1.0, "estimate_mib_per_rank": 1.0, "comm_s": None if name.startswith("torch") else 0.5}


def test_ratios_to_the_matching_torch_row():
    rows = [_row("ddp", 900.0, 20.0, 110.0), _row("torch-ddp", 1000.0, 18.0, 100.0), _row("zero3", 600.0, 30.0, 50.0),
            _row("torch-fsdp2", 500.0, 36.0, 40.0), _row("zero2", 700.0, 25.0, 60.0), _row("pp", 300.0, 60.0, 30.0)]
    got = ratios(rows)
    assert got["ddp"] == {"ref": "torch-ddp", "tokens_per_s": 0.9, "step_ms": 20.0 / 18.0, "peak_mib_per_rank": 1.1}
    assert got["zero3"] == {"ref": "torch-fsdp2", "tokens_per_s": 1.2, "step_ms": 30.0 / 36.0, "peak_mib_per_rank": 1.25}
    assert got["zero2"]["ref"] == "torch-fsdp2" and got["pp"]["ref"] == "torch-ddp"
    assert "torch-ddp" not in got and "torch-fsdp2" not in got
    text = table(rows)
    # Each ringzero row names the row its ratios are against ("vs"), then the ratios.
    assert "| vs " in text.splitlines()[0] and "| torch-fsdp2     |    1.20 |" in text
    assert "| vs " not in table([_row("ddp", 1.0, 1.0, 1.0)])  # no torch row: today's columns only


@pytest.mark.parametrize("count, local_rank, run, want_device, want_transport, want_group", [
    (1, 1, "torch-ddp", "cuda:0", "ipc", "ringzero"),   # 2 ranks on one GPU: IPC, torch rows on ringzero
    (1, 1, "pp", "cuda:0", "ipc", None),
    (2, 1, "pp+zero1", "cuda:1", "nccl", None),         # a GPU each: NCCL, torch rows on the default group
    (2, 0, "torch-fsdp2", "cuda:0", "nccl", None),
])
def test_rank_env_applies_the_decisions(monkeypatch, count, local_rank, run, want_device, want_transport, want_group):
    """The wiring in loop.rank_env and device.bind, on a machine described by hand (no GPU needed)."""
    import argparse

    import torch.distributed as dist

    from ringzero.trainer import loop

    fake = {"local_rank": local_rank, "local_world": 2, "device_count": count,
            "shared": device.gpu_shared(2, count), "nccl": True}
    monkeypatch.setattr(device, "machine", lambda device_type: dict(fake))
    made = []
    monkeypatch.setattr(dist, "new_group", lambda backend=None, **kw: made.append(backend) or f"group:{backend}")
    env = loop.rank_env(argparse.Namespace(device="cuda", precision="auto"), run)
    assert (str(env.device), env.transport, env.precision) == (want_device, want_transport, "bf16")
    assert made == ([want_group] if want_group else [])
    assert env.baseline_group == (f"group:{want_group}" if want_group else None)
    bound = []
    monkeypatch.setattr(torch.cuda, "set_device", bound.append)
    dev, backend = device.bind("cuda")
    assert bound == [torch.device(want_device)] and dev == torch.device(want_device)
    assert backend == ("cpu:gloo,cuda:nccl" if count == 2 else "gloo")
