"""A training pipeline whose losses are known, for the goodput and notification test on the local cluster.

    hpc.pipeline.plan.PIPELINES["gp"] = "tests.goodput_pipeline"; python -m hpc.submit gp --cluster slurm ...

Each attempt of `train` sleeps `startup_s` before its loop (an injected start-up), then runs steps of
`step_s`, saving every `save_every`; rank 0 writes progress.json after each step, so a test can
preempt at a chosen step. hpc's loop stops at a preemption with a checkpoint of the step it reached.
With gp.hang_at=N, rank 1 of the second attempt (restart 1) stops itself (SIGSTOP) in step N, once a
checkpoint of that attempt is committed; the loop's watchdog (gp.watchdog_s) of rank 0 names it and
requeues the job. With gp.parts, a stage `check` after `train` is an array over them, one CPU per
task, whose items in gp.fail_items raise.
"""
from __future__ import annotations

import json
import os
import signal
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
    hang_at: int = 0  # rank 1 stops itself in this step of the second attempt (0: never)
    watchdog_s: float = 0.0  # the training loop's watchdog (0: none)
    parts: List[int] = field(default_factory=list)  # stage `check`'s array (empty: no such stage)
    fail_items: List[int] = field(default_factory=list)  # these items of `check` raise


@dataclass
class GpStages:
    train: Resources = field(default_factory=lambda: Resources(nodes=1, tasks_per_node=2, cpus_per_task=1,
                                                               time_min=5, partition="low"))
    check: Resources = field(default_factory=lambda: Resources(cpus_per_task=1, time_min=5, partition="low"))


@dataclass
class GpConfig(PipelineConfig):
    stages: GpStages = field(default_factory=GpStages)
    gp: GpSection = field(default_factory=GpSection)


def stages(cfg: Any) -> List[StageDef]:
    out = [StageDef("train", "tests.goodput_pipeline:train")]
    if cfg.gp.parts:
        out.append(StageDef("check", "tests.goodput_pipeline:check", items=tuple(cfg.gp.parts), after=("train",)))
    return out


def train(ctx: Any) -> dict:
    import torch

    from hpc import ddp
    from hpc.trainloop import TrainLoop

    cfg, out = ctx.cfg["gp"], ctx.stage_dir
    time.sleep(cfg["startup_s"])  # the injected start-up, every attempt
    with ddp.session(timeout_s=60) as s:
        model = s.wrap(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with TrainLoop(s, out, save_every=cfg["save_every"], tensorboard=False,
                       watchdog_s=cfg["watchdog_s"] or None) as loop:
            resumed = loop.resume({"model": model, "optimizer": opt})
            for step in loop.steps(cfg["steps"]):
                model(torch.ones(8, 4)).pow(2).mean().backward()
                opt.step()
                if step == cfg["hang_at"] and s.rank == 1 and s.env.restart_count == 1:
                    while (loop.store.latest() or 0) <= resumed:  # a checkpoint of this attempt, then the hang
                        time.sleep(0.05)
                    os.kill(os.getpid(), signal.SIGSTOP)
                time.sleep(cfg["step_s"])
                if s.is_main:
                    tmp = out / "progress.tmp"
                    tmp.write_text(json.dumps({"step": step, "restart": int(os.environ.get("SLURM_RESTART_COUNT", 0))}))
                    os.replace(tmp, out / "progress.json")
    return {"step": loop.step}


def check(ctx: Any) -> dict:
    if ctx.item in ctx.cfg["gp"]["fail_items"]:
        raise RuntimeError(f"check: item {ctx.item} failing on request (gp.fail_items)")
    return {"item": ctx.item}


PIPELINE = PipelineDef("gp", GpConfig, stages)
