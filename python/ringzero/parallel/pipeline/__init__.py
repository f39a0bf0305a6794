"""Pipeline parallelism with schedules as data: split a model, generate a plan (a list of actions per
rank), validate and simulate it, run it with one runtime, and look at its timeline.

    stages = split(model.as_sequential(), num_stages=4, by="params")
    stage = PipelineStage(stages[rank], rank, 4, group=mesh.group("pp"))
    runner = PipelineRunner(stage, "1F1B", num_microbatches=8, loss_fn=lm_loss, optimizer=opt)
    loss = runner.step(inputs, targets)          # the loss on the last stage, None elsewhere
"""
from .plan import COMM, COMPUTE, Action, Kind, Plan, add_communication, forward_plan
from .runtime import PipelineRunner, gather_timeline
from .schedules import SCHEDULES, GPipe, Interleaved1F1B, OneFOneB, ZeroBubbleH1, make_plan
from .simulate import DeadlockError, SimResult, bubble_fraction, measured_costs, simulate, uniform_costs
from .split import split
from .stage import PipelineStage
from .trace import chrome_trace, plot_timelines
from .transport import TRANSPORTS, choose_transport
from .validate import PlanError, validate

__all__ = [
    "Action", "Kind", "Plan", "COMPUTE", "COMM", "add_communication", "forward_plan", "TRANSPORTS", "choose_transport",
    "SCHEDULES", "GPipe", "OneFOneB",
    "Interleaved1F1B", "ZeroBubbleH1", "make_plan", "validate", "PlanError", "simulate", "SimResult",
    "DeadlockError", "uniform_costs", "measured_costs", "bubble_fraction", "split", "PipelineStage",
    "PipelineRunner", "gather_timeline", "chrome_trace", "plot_timelines",
]
