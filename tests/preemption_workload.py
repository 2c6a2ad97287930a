"""A deterministic CPU DDP training job for the preemption tests, run through submitit.

    python -m pytest tests/slurm/test_preemption.py -m slurm

Every step's data is a function of (step, rank) and dropout draws from the torch RNG, so the final
weights are bitwise reproducible only if a resume restores model, optimizer, scheduler and RNG
state exactly. Rank 0 writes progress.json after each step so a test can preempt at a chosen step.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def _record(path: Path, **fields) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(fields))
    os.replace(tmp, path)


def train(out_dir: str, total: int = 40, step_s: float = 0.15, save_every: int = 5,
          max_timeouts: int = 3, ballast_mb: int = 0, ballast_every: int = 1) -> dict:
    import torch

    from hpc import ddp
    from hpc.runtime import rng
    from hpc.checkpoint import store as store_module
    from hpc.runtime.session import bitwise_ddp_kwargs
    from hpc.trainloop import TrainLoop

    out = Path(out_dir)
    with ddp.session(timeout_s=120) as s:
        rng.seed_all(1234 + s.rank)  # ranks differ in dropout masks: per-rank RNG state matters
        torch.manual_seed(0)  # identical initial weights on every rank (DDP also broadcasts them)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
        rng.seed_all(1234 + s.rank)
        model = s.wrap(model, **bitwise_ddp_kwargs())
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
        with TrainLoop(s, out, save_every=save_every, max_timeouts=max_timeouts) as loop:
            start = loop.resume({"model": model, "optimizer": opt, "scheduler": sched})
            ballast = bool(ballast_mb) and s.rank % ballast_every == ballast_every - 1
            if ballast:
                # makes each checkpoint write long enough to be killed in the middle
                loop.extra["ballast"] = torch.zeros(ballast_mb * 2**18)
                # ... and written by a forked writer, which auto mode picks from a larger state
                store_module.AUTO_FORK_BYTES = min(store_module.AUTO_FORK_BYTES, ballast_mb * 2**19)
            (out / f"pid-{s.rank}").write_text(str(os.getpid()))  # for the SIGKILL test
            if s.is_main:
                with open(out / "attempts.jsonl", "a") as f:
                    f.write(json.dumps({"restart": os.environ.get("SLURM_RESTART_COUNT", "0"),
                                        "resumed_from": start}) + "\n")
            for step in loop.steps(total):
                g = torch.Generator().manual_seed(step * 100 + s.rank)
                x = torch.randn(32, 8, generator=g)
                loss = (model(x) - x[:, :1] * 2).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
                loop.log("loss", loss.item())
                if s.is_main:
                    _record(out / "progress.json", step=step,
                            restart=int(os.environ.get("SLURM_RESTART_COUNT", "0")))
                time.sleep(step_s)  # leaves room to preempt in the middle of the run
        if s.is_main:
            torch.save(getattr(model, "module", model).state_dict(), out / "weights.pt")
        return {"rank": s.rank, "step": loop.step, "resumed_from": start, "ballast": ballast}
