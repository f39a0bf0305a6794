"""One rank's run of one strategy or torch baseline: build, (resume), train, validate, summarise."""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

import ringzero

from ..data import batch as make_batch
from ..data import corpus_info, stdlib_corpus
from ..parallel.layout import Layout
from ..parallel.pipeline.transport import choose_transport
from . import device as devices
from .estimate_check import cpu_probe_for_run, estimate_for_run, predicted_step_for_run
from .faults import maybe_fault, step_gate
from .layout import BASELINES, layout_of
from .metering import METERED_STEPS, PeakMemory, core_wait_s
from .models import model_family
from .registry import run_class
from .run import RankEnv, Run, RunCheckpoint


def rank_env(args, run: str) -> RankEnv:
    """This rank's device, precision, pipeline transport and baseline group (device.py's decisions).
    Collective: a torch row on a shared GPU makes its group here."""
    m = devices.machine(args.device)
    device = devices.rank_device(args.device, m["local_rank"], m["device_count"])
    group = None
    if run in BASELINES:
        backend = devices.baseline_backend(args.device, m["shared"], m["nccl"])
        if backend is not None:
            group = dist.new_group(backend=backend)
    return RankEnv(device=device, precision=devices.precision_of(getattr(args, "precision", "auto"), args.device),
                   transport=choose_transport(device.type, m["shared"], m["nccl"]), baseline_group=group)


def make_run(run: str, layout: Layout, model, args, env: RankEnv) -> Run:
    """The Run of `run` (a strategy or a torch baseline, its class from registry.py) with `layout` on this
    rank, training `model` (as the family of --model built it, trainer/models.py); every rank calls it."""
    return run_class(run).create(layout, model, args, env)


def train_rank(args, run: str) -> dict:
    """Trains on this rank; returns the run's summary (meaningful on rank 0), with each rank's peak
    tensor memory (metering.py) and ringzero.estimate's prediction for the same layout."""
    env = rank_env(args, run)
    with PeakMemory(env.device) as peak:
        summary, strategy_run, probe = _train(args, run, env, stop_meter=peak.stop)
    stats = torch.tensor([peak.tensor_bytes, peak.rss_bytes], dtype=torch.float64)
    world = dist.get_world_size()
    table = torch.empty(world * 2, dtype=torch.float64)
    ringzero.all_gather_single(table, stats)
    table = table.view(world, 2) / 2**20
    summary.update(peak_mib_per_rank=float(table[:, 0].max()), peak_mib_by_rank=table[:, 0].tolist(),
                   rss_mib_per_rank=float(table[:, 1].max()))
    summary.update(estimate_for_run(args, run, world, strategy_run.layers_per_stage))
    pred = predicted_step_for_run(args, run, world, env.device.type, env.precision, strategy_run.layers_per_stage,
                                  probe, env.baseline_group)
    if pred["pred_step_ms"] is not None:
        # Each rank predicts its step from the rates its own core gave; a step ends with the slower rank.
        mine, each = torch.tensor([pred["pred_step_ms"]], dtype=torch.float64), torch.empty(world, dtype=torch.float64)
        ringzero.all_gather_single(each, mine)
        pred.update(pred_step_ms=float(each.max()), pred_step_ms_by_rank=each.tolist())
    summary.update(pred)
    return summary


def _checkpoint_of(strategy_run: Run, run: str, flag: str) -> RunCheckpoint:
    """What `flag` (--resume or --save-every) saves or loads for this run; ValueError for a run without."""
    state = strategy_run.checkpoint()
    if state is None:
        raise ValueError(f"{flag} is not supported for {run}: checkpoints cover DDP, ZeRO, tp and tp+zero1 runs")
    return state


def _resume(args, run: str, layout: Layout, strategy_run: Run) -> int:
    from .. import checkpoint

    state = _checkpoint_of(strategy_run, run, "--resume")
    try:
        path = checkpoint.latest(args.checkpoint_dir)
    except FileNotFoundError:
        return 0  # nothing saved yet: a restart before the first checkpoint starts over
    family = model_family(args)
    try:
        loaded = checkpoint.load(path, state.model, state.optimizer)
    except KeyError as e:  # a parameter the checkpoint lacks: saved by a run of another form
        note = family.checkpoint_note
        raise ValueError(f"--resume: {e.args[0]}" + (f"; {note}" if note else "")) from None
    # Checked after the load, which is where the saved record is read; the run stops here if refused.
    family.check_resume(loaded["extra"], layout.tp)
    return loaded["step"]


def _save(args, run: str, layout: Layout, strategy_run: Run, step: int):
    from .. import checkpoint

    state = _checkpoint_of(strategy_run, run, "--save-every")
    checkpoint.save(args.checkpoint_dir, state.model, state.optimizer, step=step,
                    extra=model_family(args).checkpoint_extra(layout.tp))


def _train(args, run: str, env: RankEnv, stop_meter=lambda: None):
    """The run itself: returns (summary without memory figures, the strategy's run object, the CpuProbe
    sampled after each timed step or None: estimate_check.cpu_probe_for_run)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if env.device.type == "cuda" and env.precision == "fp32":
        torch.set_float32_matmul_precision("highest")  # fp32 means float32 matmuls, not TF32
    family = model_family(args)
    model = family.build()  # on the CPU from --seed: the same weights on every device
    n_params = sum(p.numel() for p in model.parameters())
    model = model.to(env.device)
    train_data, val_data = stdlib_corpus()
    layout = layout_of(run, world, args.pp, args.tp)
    strategy_run = make_run(run, layout, model, args, env)
    val_batches = [tuple(t.to(env.device) for t in make_batch(val_data, args.batch, args.seq, args.seed + 1, i))
                   for i in range(args.val_batches)]
    start = _resume(args, run, layout, strategy_run) if args.resume else 0

    bar = None
    if rank == 0 and not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=args.steps, initial=start, desc=run, unit="step", dynamic_ncols=True)
    losses, vals, step_times, waits = [], [], [], []
    initial_val = strategy_run.val_loss(val_batches) if start == 0 else float("nan")
    comm0, a2a0 = ringzero.comm_seconds(), strategy_run.exchange_seconds()
    cuda = env.device.type == "cuda"
    probe, want_probe = None, True
    # At most CALIBRATION_REPEATS samples (about 30 ms each), spread over the timed steps: the rates of the
    # run's own minutes, at a cost that does not grow with --steps.
    from ..estimate.cpu_kind import CALIBRATION_REPEATS

    probe_every = max(1, (args.steps - start - METERED_STEPS) // CALIBRATION_REPEATS)
    for step in range(start, args.steps):
        if step == start + METERED_STEPS:
            stop_meter()
        maybe_fault(step)
        step_gate(step)
        x, y = (t.to(env.device) for t in make_batch(train_data, args.batch, args.seq, args.seed, step))
        t0, w0 = time.perf_counter(), core_wait_s()
        loss = strategy_run.train_step(x, y, step)  # returns a host float: the step's GPU work is done
        if cuda:
            torch.cuda.synchronize(env.device)
        step_times.append(time.perf_counter() - t0)
        waits.append(core_wait_s() - w0)
        if want_probe and step >= start + METERED_STEPS and (step - start - METERED_STEPS) % probe_every == 0:
            # made after the meter stopped: not the run's tensors
            probe = probe or cpu_probe_for_run(args, run, world, env.device.type, env.precision)
            want_probe = probe is not None
            if probe is not None:
                probe.sample()  # the rates of these minutes, outside the step's timing
                want_probe = len(probe.samples) < CALIBRATION_REPEATS
        losses.append((step, loss))
        if (args.val_every and (step + 1) % args.val_every == 0) or step + 1 == args.steps:
            vals.append((step, strategy_run.val_loss(val_batches)))
        if args.save_every and (step + 1) % args.save_every == 0:
            _save(args, run, layout, strategy_run, step + 1)
        if bar is not None:
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{args.batch * args.seq / step_times[-1]:.0f}", refresh=False)
            bar.update(1)
    if bar is not None:
        bar.close()

    a2a1 = strategy_run.exchange_seconds()
    # The slowest rank's seconds; a2a (expert parallelism's all-to-alls, timed around the exchange function
    # for ringzero's and torch's alike) is also inside comm for a ringzero row.
    comm_s = torch.tensor([ringzero.comm_seconds() - comm0, a2a1 - a2a0 if a2a1 is not None else 0.0],
                          dtype=torch.float64)
    ringzero.all_reduce(comm_s, op=ringzero.ReduceOp.MAX)
    # [Note: a step's time on its cores] On a shared machine other processes take the ranks' cores for part
    # of a step; a step waits for its slowest rank, so the step's time on its cores is its wall time less
    # the longest wait of any rank for a core in that step. The step-time model predicts that.
    waits_max = torch.tensor(waits, dtype=torch.float64)
    ringzero.all_reduce(waits_max, op=ringzero.ReduceOp.MAX)
    on_cores = [max(0.0, t - w) for t, w in zip(step_times, waits_max.tolist())]
    # The first step includes one-time setup; the metered ones pay for counting.
    skip = METERED_STEPS if len(step_times) > METERED_STEPS else (1 if len(step_times) > 1 else 0)
    timed = step_times[skip:]
    timed_on_cores = sorted(on_cores[skip:])
    step_s = sum(timed) / max(1, len(timed))
    return {
        "strategy": run, "ranks": world, "steps": args.steps, "start_step": start,
        "params": n_params, "model": family.name, "device": str(env.device.type), "precision": env.precision,
        "recompute": getattr(args, "recompute", "none"),
        "zeropp": layout.zero_stage == 3 and getattr(args, "zeropp", None) or None,
        "pipeline_transport": env.transport if layout.pipeline else None,
        "tp": layout.tp,
        "corpus": corpus_info(),
        "train_losses": losses, "val_losses": vals,
        "final_train_loss": losses[-1][1] if losses else float("nan"),
        "final_val_loss": vals[-1][1] if vals else float("nan"),
        "initial_val_loss": initial_val,
        "step_ms": step_s * 1e3, "tokens_per_s": args.batch * args.seq / step_s,
        "step_ms_median": sorted(timed)[len(timed) // 2] * 1e3 if timed else float("nan"),
        # The median step less its longest wait for a core: what the predicted step time is held to.
        "step_ms_on_cores": timed_on_cores[len(timed_on_cores) // 2] * 1e3 if timed else float("nan"),
        "core_wait_ms_each": [round(w * 1e3, 3) for w in waits_max.tolist()],
        "step_ms_each": [round(t * 1e3, 3) for t in step_times],  # every step, the first included
        # ringzero's collectives only: a torch row's own communication is not counted, so it shows none.
        "comm_s": None if run in BASELINES else float(comm_s[0]),
        "a2a_s": None if a2a1 is None else float(comm_s[1]),
        **strategy_run.summary(),
    }, strategy_run, probe
