"""A one-stage training pipeline whose losses are known, for the goodput test on the local cluster.

    hpc.pipeline.plan.PIPELINES["gp"] = "tests.goodput_pipeline"; python -m hpc.submit gp --cluster slurm ...

Each attempt sleeps `startup_s` before its loop (an injected start-up), then runs steps of `step_s`,
saving every `save_every`; rank 0 writes progress.json after each step, so a test can preempt at a
chosen step. hpc's loop stops at a preemption with a checkpoint of the step it reached.
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
class GpSection:
    steps: int = 40
    step_s: float = 0.25
    save_every: int = 10
    startup_s: float = 3.0


@dataclass
class GpStages:
    train: Resources = field(default_factory=lambda: Resources(nodes=1, tasks_per_node=2, cpus_per_task=1,
                                                               time_min=5, partition="low"))


@dataclass
class GpConfig(PipelineConfig):
    stages: GpStages = field(default_factory=GpStages)
    gp: GpSection = field(default_factory=GpSection)


def stages(cfg: Any) -> List[StageDef]:
    return [StageDef("train", "tests.goodput_pipeline:train")]


def train(ctx: Any) -> dict:
    import torch

    from hpc import ddp
    from hpc.trainloop import TrainLoop

    cfg, out = ctx.cfg["gp"], ctx.stage_dir
    time.sleep(cfg["startup_s"])  # the injected start-up, every attempt
    with ddp.session(timeout_s=60) as s:
        model = s.wrap(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with TrainLoop(s, out, save_every=cfg["save_every"], tensorboard=False) as loop:
            loop.resume({"model": model, "optimizer": opt})
            for step in loop.steps(cfg["steps"]):
                model(torch.ones(8, 4)).pow(2).mean().backward()
                opt.step()
                time.sleep(cfg["step_s"])
                if s.is_main:
                    tmp = out / "progress.tmp"
                    tmp.write_text(json.dumps({"step": step, "restart": int(os.environ.get("SLURM_RESTART_COUNT", 0))}))
                    os.replace(tmp, out / "progress.json")
    return {"step": loop.step}


PIPELINE = PipelineDef("gp", GpConfig, stages)
