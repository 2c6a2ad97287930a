"""A small Accelerate script (documented API only): a checkpoint every few steps, resumed with --resume."""
import argparse
import json
import os
import time

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration


def hold(step):
    """The test's gate (tests/slurm/test_frameworks.py): on the first attempt every rank waits at step
    HOLD_AT until the file `go` appears in the working directory, so that one preemption finds every
    job mid-training. Not part of what a user's script needs."""
    if step == int(os.environ.get("HOLD_AT", "-1")) and os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
        while not os.path.exists("go"):
            time.sleep(0.1)


class Counter:
    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        self.step = state["step"]


parser = argparse.ArgumentParser()
parser.add_argument("--resume", action="store_true")
parser.add_argument("--steps", type=int, default=int(os.environ.get("MAX_STEPS", "40")))
args = parser.parse_args()

accelerator = Accelerator(project_config=ProjectConfiguration(project_dir="out", automatic_checkpoint_naming=True,
                                                              total_limit=3))
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1))
loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
counter = Counter()
accelerator.register_for_checkpointing(counter)
if args.resume:
    accelerator.load_state()
started = counter.step
while counter.step < args.steps:
    for x, y in loader:
        hold(counter.step)
        time.sleep(float(os.environ.get("STEP_SLEEP", "0.2")))
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        counter.step += 1
        if counter.step % 5 == 0:
            accelerator.save_state()
        if accelerator.is_main_process:
            with open("progress.json", "w") as fh:
                json.dump({"started": started, "step": counter.step, "world": accelerator.num_processes,
                           "restart": os.environ.get("SLURM_RESTART_COUNT", "0")}, fh)
        if counter.step >= args.steps:
            break
accelerator.wait_for_everyone()
if accelerator.is_main_process:
    print("finished at step", counter.step, flush=True)
