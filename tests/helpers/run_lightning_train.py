"""Trains a small regression model with PyTorch Lightning on 2 CPU processes with
DDPStrategy(process_group_backend=BACKEND), then saves the initial and final parameters: run by
tests/backend/test_frameworks.py once with "gloo" and once with "ringzero". The ranks are forked (Lightning's
"ddp_fork"): spawned, each imported torch, Lightning and ringzero again, 55 s for the test against 33 on the
2-core machine; a rank's clean exit after destroy_process_group is tests/collectives/test_shutdown.py's.

    python tests/helpers/run_lightning_train.py BACKEND OUT_PATH
"""
import sys

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

import ringzero  # noqa: F401  registers "ringzero" (the forked ranks inherit it)

STEPS, BATCH, FEATURES = 12, 8, 16


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        # Which c10d backend the ranks' default group ran (1: ringzero's); a buffer, so that it comes
        # back to the launching process with the parameters.
        self.register_buffer("ran_on_ringzero", torch.zeros((), dtype=torch.int64))

    def on_train_start(self):
        backend = torch.distributed.group.WORLD._get_backend(torch.device("cpu"))
        self.ran_on_ringzero.fill_(int(type(backend).__name__ == "RingzeroBackend"))

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main(backend: str, out_path: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(2 * STEPS * BATCH, FEATURES)
    y = x.sum(dim=1, keepdim=True).sin()
    data = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=False)
    model = Regression()
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    trainer = L.Trainer(accelerator="cpu", devices=2, max_epochs=1,
                        strategy=DDPStrategy(process_group_backend=backend, start_method="fork"),
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, data)
    if trainer.global_rank == 0:
        final = {k: v.detach().clone() for k, v in model.state_dict().items()}
        torch.save({"initial": initial, "final": final}, out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
