"""A small Lightning script (documented API only): 2 ranks of DDP on CPU, a checkpoint every few steps."""
import json
import os
import sys
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

MAX_STEPS = int(os.environ.get("MAX_STEPS", "40"))


def hold(step):
    """The test's gate (tests/slurm/test_frameworks.py): on the first attempt every rank waits at step
    HOLD_AT until the file `go` appears in the working directory, so that one preemption finds every
    job mid-training. Not part of what a user's script needs."""
    if step == int(os.environ.get("HOLD_AT", "-1")) and os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
        while not os.path.exists("go"):
            time.sleep(0.1)


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        hold(self.global_step)
        time.sleep(float(os.environ.get("STEP_SLEEP", "0.2")))
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Progress(Callback):
    """Rank 0 writes the step it started from and the step it reached."""

    def on_train_start(self, trainer, module):
        self.started = trainer.global_step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.is_global_zero:
            with open("progress.json", "w") as fh:
                json.dump({"started": self.started, "step": trainer.global_step,
                           "world": trainer.world_size, "restart": os.environ.get("SLURM_RESTART_COUNT", "0")}, fh)


if __name__ == "__main__":
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1))
    trainer = L.Trainer(accelerator="cpu", strategy="ddp", max_steps=MAX_STEPS, logger=False,
                        enable_progress_bar=False,
                        callbacks=[Progress(), ModelCheckpoint(every_n_train_steps=5, save_last=True)])
    trainer.fit(Tiny(), DataLoader(data, batch_size=16))
    if trainer.is_global_zero:
        print("finished at step", trainer.global_step, flush=True)
    sys.exit(0)
