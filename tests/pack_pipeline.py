"""A one-stage pipeline whose array items each train a small float64 model through TrainLoop, for
packed jobs' preemption and resume on the local cluster (tests/slurm/test_packing.py).

    hpc.pipeline.plan.PIPELINES["pk"] = "tests.pack_pipeline"; python -m hpc.submit pk --cluster slurm ...

Item i starts from seed i and trains on batches drawn from seed (i, step): the same weights whatever
the job it runs in, packed or not, preempted or not. It saves every step; rank 0 writes progress.json
(its last step) after each step and one line per attempt to attempts.jsonl (the job, the restart
count, the first step it trained); pk.short_items train pk.short_steps only; the final weights go to
weights.pt.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, List

from hpc.config.schema import PipelineConfig, Resources
from hpc.pipeline.plan import PipelineDef, StageDef


@dataclass
class PkSection:
    parts: List[int] = field(default_factory=lambda: [0, 1, 2, 3])
    steps: int = 16
    step_s: float = 0.5
    short_items: List[int] = field(default_factory=list)  # these train short_steps only
    short_steps: int = 2


@dataclass
class PkStages:
    train: Resources = field(default_factory=lambda: Resources(cpus_per_task=1, gpus_per_node=1, time_min=5,
                                                               partition="low"))


@dataclass
class PkConfig(PipelineConfig):
    stages: PkStages = field(default_factory=PkStages)
    pk: PkSection = field(default_factory=PkSection)


def stages(cfg: Any) -> List[StageDef]:
    return [StageDef("train", "tests.pack_pipeline:train", items=tuple(cfg.pk.parts))]


def train(ctx: Any) -> dict:
    import torch

    from hpc import ddp
    from hpc.trainloop import TrainLoop

    cfg, out = ctx.cfg["pk"], ctx.stage_dir
    steps = cfg["short_steps"] if ctx.item in cfg["short_items"] else cfg["steps"]
    torch.set_num_threads(1)
    torch.manual_seed(ctx.item)
    with ddp.session(timeout_s=60) as s:
        model = s.wrap(torch.nn.Linear(4, 1).double())
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        with TrainLoop(s, out, save_every=1) as loop:
            loop.resume({"model": model, "optimizer": opt})
            if s.is_main:
                with open(out / "attempts.jsonl", "a") as f:
                    f.write(json.dumps({"job": ctx.env.job_id, "restart": ctx.env.restart_count,
                                        "first": loop.resumed_step + 1}) + "\n")
            for step in loop.steps(steps):
                batch = torch.randn(8, 4, generator=torch.Generator().manual_seed(1000 * ctx.item + step)).double()
                opt.zero_grad()
                model(batch).pow(2).mean().backward()
                opt.step()
                time.sleep(cfg["step_s"])
                if s.is_main:
                    (out / "progress.tmp").write_text(json.dumps({"step": step}))
                    os.replace(out / "progress.tmp", out / "progress.json")
        if s.is_main:
            torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out / "weights.pt")
    return {"step": steps}


PIPELINE = PipelineDef("pk", PkConfig, stages)
