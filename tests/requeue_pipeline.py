"""Two stages without hpc's loop, for telling a time limit from a preemption on the local cluster.

    hpc.pipeline.plan.PIPELINES["rq"] = "tests.requeue_pipeline"; python -m hpc.submit rq --cluster slurm ...

Each stage's first attempt (restart 0) writes started.txt and waits rq.hold_s; a later one returns at
once. `limit` has a 1-minute limit and its signal 50 s before it: submitit's own handler requeues it
about 10 s in. `preempt` has 5 minutes: a test preempts it (hpc.cluster.preempt). Each asks for a
whole node (8 CPUs), so a preemption of one leaves the other running.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, List

from hpc.config.schema import PipelineConfig, Resources
from hpc.pipeline.plan import PipelineDef, StageDef


@dataclass
class RqSection:
    hold_s: float = 60.0


def _node(**kw: Any) -> Resources:
    return Resources(cpus_per_task=8, partition="low", **kw)


@dataclass
class RqStages:
    limit: Resources = field(default_factory=lambda: _node(time_min=1, signal_delay_s=50))
    preempt: Resources = field(default_factory=lambda: _node(time_min=5))


@dataclass
class RqConfig(PipelineConfig):
    stages: RqStages = field(default_factory=RqStages)
    rq: RqSection = field(default_factory=RqSection)


def stages(cfg: Any) -> List[StageDef]:
    return [StageDef("limit", "tests.requeue_pipeline:hold"), StageDef("preempt", "tests.requeue_pipeline:hold")]


def hold(ctx: Any) -> dict:
    restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    if restart == 0:
        (ctx.stage_dir / "started.txt").write_text(str(time.time()))
        time.sleep(ctx.cfg["rq"]["hold_s"])
    return {"restart": restart}


PIPELINE = PipelineDef("rq", RqConfig, stages)
