"""A small HF Trainer script (documented API only): 2 ranks on CPU, a checkpoint every few steps."""
import json
import os
import time

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

MAX_STEPS = int(os.environ.get("MAX_STEPS", "40"))


def hold(step):
    """The test's gate (tests/slurm/test_frameworks.py): on the first attempt every rank waits at step
    HOLD_AT until the file `go` appears in the working directory, so that one preemption finds every
    job mid-training. Not part of what a user's script needs."""
    if step == int(os.environ.get("HOLD_AT", "-1")) and os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
        while not os.path.exists("go"):
            time.sleep(0.1)


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def forward(self, x, labels=None):
        time.sleep(float(os.environ.get("STEP_SLEEP", "0.2")))
        out = self.layer(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


class Data(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(4096, 8, generator=g), torch.randn(4096, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class Progress(TrainerCallback):
    def on_train_begin(self, args, state, control, **kw):
        self.started = state.global_step

    def on_step_begin(self, args, state, control, **kw):
        hold(state.global_step)

    def on_step_end(self, args, state, control, **kw):
        if state.is_world_process_zero:
            with open("progress.json", "w") as fh:
                json.dump({"started": self.started, "step": state.global_step,
                           "restart": os.environ.get("SLURM_RESTART_COUNT", "0")}, fh)


if __name__ == "__main__":
    args = TrainingArguments(output_dir="out", max_steps=MAX_STEPS, per_device_train_batch_size=16,
                             save_steps=5, logging_steps=5, report_to=[], use_cpu=True, ddp_backend="gloo",
                             dataloader_num_workers=0)
    trainer = Trainer(model=Tiny(), args=args, train_dataset=Data(), callbacks=[Progress()])
    trainer.train()
    if trainer.is_world_process_zero():
        print("finished at step", trainer.state.global_step, flush=True)
