"""A torchrun-style script (plain torch.distributed, nanoGPT's habits): DDP over gloo, rank 0 overwrites
its only checkpoint, out/ckpt.pt, in place every few steps, and resumes only when told (--init_from=resume)."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

def hold(step):
    """The test's gate (tests/slurm/test_frameworks.py): on the first attempt every rank waits at step
    HOLD_AT until the file `go` appears in the working directory, so that one preemption finds every
    job mid-training. Not part of what a user's script needs."""
    if step == int(os.environ.get("HOLD_AT", "-1")) and os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
        while not os.path.exists("go"):
            time.sleep(0.1)


init_from = "scratch"
max_iters = int(os.environ.get("MAX_STEPS", "40"))
for arg in sys.argv[1:]:  # nanoGPT-style --key=value overrides
    key, _, value = arg.lstrip("-").partition("=")
    if key == "init_from":
        init_from = value
    elif key == "max_iters":
        max_iters = int(value)

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
if init_from == "resume":
    ckpt = torch.load(os.path.join("out", "ckpt.pt"), map_location="cpu")
    model.module.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    step = ckpt["iter_num"]
started = step
os.makedirs("out", exist_ok=True)
while step < max_iters:
    hold(step)
    time.sleep(float(os.environ.get("STEP_SLEEP", "0.2")))
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
    if rank == 0 and step % 5 == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": step},
                   os.path.join("out", "ckpt.pt"))
    if rank == 0:
        with open("progress.json", "w") as fh:
            json.dump({"started": started, "step": step, "world": dist.get_world_size(),
                       "restart": os.environ.get("SLURM_RESTART_COUNT", "0")}, fh)
dist.barrier()
if rank == 0:
    print("finished at step", step, flush=True)
dist.destroy_process_group()
