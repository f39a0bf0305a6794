"""Shared pieces of the `ringzero train` tests."""

TINY = ["--nproc", "2", "--batch", "8", "--seq", "32", "--layers", "2", "--d-model", "64", "--heads", "2",
        "--no-progress", "--val-batches", "1"]
"""2 ranks, a 0.13M-parameter model and tiny batches: a run of a few steps takes seconds."""


def one_process_moe_losses(argv: list[str], slices: int) -> tuple[list[float], list[float]]:
    """The one-process reference of `ringzero train --model moe` with the expert-parallel runs on `slices`
    ranks: the same model (the trainer's MoEFamily from `argv`, parsed by the command itself), batches,
    FusedAdamW, warm-up and clip, every expert in this one process. Each step's global batch is cut into
    the ranks' `slices` and each slice is one forward, as on its rank, so that the load-balancing loss
    (over one forward's tokens) is the ranks'; backward runs from the mean over the slices of the language-model
    loss plus the load-balancing loss (the gradient of the ranks' mean). Returns, per step, the mean over the
    slices of the language-model loss and of the load-balancing loss (what train_losses and train_aux_losses
    hold). No process group: it runs in the calling process."""
    import torch

    from ringzero.cli import train
    from ringzero.data import batch, stdlib_corpus
    from ringzero.models import lm_loss
    from ringzero.trainer.models import model_family
    from ringzero.trainer.run import replica_slice, set_lr
    from ringzero.trainer.strategies import fused_adamw

    args = train.parse_args(argv)
    model = model_family(args).build()
    opt = fused_adamw(model.parameters(), args)
    data, _ = stdlib_corpus()
    losses, aux_losses = [], []
    for step in range(args.steps):
        x, y = batch(data, args.batch, args.seq, args.seed, step)
        set_lr(opt, args.lr, step)
        total, lm_sum, aux_sum = 0.0, 0.0, 0.0
        for s in range(slices):
            lm = lm_loss(model(replica_slice(x, slices, s)), replica_slice(y, slices, s))
            aux = model.aux_loss()
            total = total + (lm + aux) / slices
            lm_sum, aux_sum = lm_sum + lm.item(), aux_sum + aux.item()
        total.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(lm_sum / slices)
        aux_losses.append(aux_sum / slices)
    return losses, aux_losses
