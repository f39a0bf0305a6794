"""The training behind `ringzero train` (train.py is its command line), one concern per module:

  layout.py         what is checked before any rank starts (names, layouts; parallel.layout's rules)
  models.py         the model families of --model (the byte GPT, moe, hf:llama, hf:gpt2, hf:qwen2): what each
                    strategy needs from a model (build, tensor-parallel form, pipeline cut, ZeRO-3 unit)
  device.py         rank to GPU, process-group backends, precision (pure decisions, unit-tested on CPU)
  run.py            the Run interface every run implements (create, train_step, val_loss, checkpoint), the
                    RankEnv it is built in, and what all runs share (warm-up, AdamW settings, batch slices)
  strategies.py     ringzero's runs: ddp, zero1-3 (DataParallelRun), tp, tp+zero1 (TensorParallelRun),
                    ep, ep+zero1 (ExpertParallelRun), pp, pp+zero1/2 and 3d (PipelineRun)
  baselines*.py     the stock rows: torch-ddp, torch-fsdp2, torch-pp, torch-tp, torch-ep, deepspeed-zero1/2/3
  registry.py       the one table from a run's name to its Run class
  loop.py           one rank's run: build (through the registry), resume, train, validate, summarise
  metering.py       peak tensor memory per rank (CPU meter or torch.cuda statistics)
  faults.py         RINGZERO_FAULT, for the restart test
  estimate_check.py ringzero.estimate's prediction for the same layout (an hf model as its parameter count)
  report.py         the table with ratios to torch rows, and the PNG
"""
from .estimate_check import estimate_for_run
from .faults import maybe_fault
from .layout import BASELINES, RUNS, check_recompute, check_run, check_schedule
from .loop import train_rank
from .report import ratios, table

_maybe_fault = maybe_fault  # the name tests/collectives/test_bad_calls.py imports

__all__ = ["train_rank", "check_recompute", "check_run", "check_schedule", "estimate_for_run", "maybe_fault", "ratios",
           "table", "BASELINES", "RUNS"]
