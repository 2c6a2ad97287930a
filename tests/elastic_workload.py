"""TrainLoop under DDP or FSDP, stopped and resumed on another world size (tests of elastic resume).

    python tests/elastic_workload.py OUT --strategy fsdp --steps 6 --stop-at 3

Every optimizer step takes GLOBAL_BATCH samples of a fixed float64 data set through s.loader,
planned by s.plan_batch (2 ranks: one micro-batch each; 1 rank: two, accumulated), with an LR
schedule. Each rank appends, per step, the ids of the samples it trained on to OUT/ids-<rank>.jsonl
and rank 0 the mean loss to OUT/loss.jsonl; the final full model state goes to OUT/final.pt.
--stop-at N sends this process the pre-timeout signal at step N: TrainLoop checkpoints and stops.
--save-every N adds periodic (asynchronous) checkpoints, keeping 2.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path
from typing import Callable

import torch

import hpc.ddp
from hpc.trainloop import TrainLoop
from fsdp_workload import Net, dump  # noqa: E402 (tests/ on the path)

GLOBAL_BATCH, PER_DEVICE_MAX, SAMPLES = 12, 6, 48


def dataset() -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 8, generator=gen, dtype=torch.float64)
    return torch.utils.data.TensorDataset(torch.arange(SAMPLES), x, torch.sin(x.sum(1, keepdim=True)))


def train(s, out: Path, strategy: str = "ddp", steps: int = 6, stop_at: int = 0, save_every: int = 100,
          tag: str = "", before_step: Callable[[TrainLoop, int], None] = lambda loop, step: None) -> None:
    """The training of main() in session `s`. `tag` prefixes the log names (ids-<tag><rank>.jsonl,
    loss<tag>.jsonl), so that attempts can log apart; `before_step(loop, step)` runs before each step."""
    torch.manual_seed(0)
    model = s.wrap(Net().double(), strategy=strategy)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    plan = s.plan_batch(GLOBAL_BATCH, PER_DEVICE_MAX)
    loader = s.loader(dataset(), batch_size=plan.micro_batch, seed=3)
    with TrainLoop(s, out, save_every=save_every, keep=2, tensorboard=False) as loop:
        loop.resume({"model": model, "optimizer": opt, "sched": sched, "data": loader})
        batches = loader.batches()
        ids_log = open(out / f"ids-{tag}{s.rank}.jsonl", "a")
        for step in loop.steps(steps):
            before_step(loop, step)
            ids, total = [], 0.0
            for micro in range(plan.accum_steps):
                idx, x, y = next(batches)
                with s.no_sync_if(not plan.sync_step(micro)):
                    loss = torch.nn.functional.mse_loss(model(x), y) / plan.accum_steps
                    loss.backward()
                ids += idx.tolist()
                total += loss.item()
            opt.step()
            sched.step()
            opt.zero_grad()
            ids_log.write(json.dumps({"step": step, "ids": ids}) + "\n")
            ids_log.flush()
            mean = s.all_reduce_mean(total)
            if s.is_main:
                with open(out / f"loss{tag}.jsonl", "a") as f:
                    f.write(json.dumps({"step": step, "loss": mean}) + "\n")
            if step == stop_at:
                os.kill(os.getpid(), signal.SIGUSR2)
    dump(s, model, opt, out / "final.pt")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--strategy", default="ddp")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--stop-at", type=int, default=0)
    p.add_argument("--save-every", type=int, default=100)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    with hpc.ddp.session(timeout_s=120) as s:
        print(f"world size {s.world_size}", flush=True)
        train(s, a.out, a.strategy, a.steps, a.stop_at, a.save_every)


if __name__ == "__main__":
    main()
