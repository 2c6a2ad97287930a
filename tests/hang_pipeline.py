"""A one-stage pipeline whose 2 x 2 training job has a rank that hangs (tests/hang_workload.py).

    hpc.pipeline.plan.PIPELINES["hang"] = "tests.hang_pipeline"; python -m hpc.submit hang --cluster slurm ...

In its first attempt rank hang.stop_rank stops itself (SIGSTOP) after step hang.stop_at; the
watchdog (hang.watchdog_s) of the other ranks saves every rank's stacks, names the stuck rank and
requeues the job, whose next attempt resumes from the last checkpoint and finishes.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List

from hpc.config.schema import PipelineConfig
from hpc.pipeline.plan import PipelineDef, StageDef
from tests.elastic_pipeline import TrainOn2x2


@dataclass
class HangSection:
    steps: int = 4
    step_s: float = 0.1
    save_every: int = 2
    watchdog_s: float = 3.0
    stop_rank: int = 3
    stop_at: int = 3
    timeout_s: float = 60.0  # collectives during start-up
    train_timeout_s: float = 30.0  # and after the first step: longer than the watchdog


@dataclass
class HangConfig(PipelineConfig):
    stages: TrainOn2x2 = field(default_factory=TrainOn2x2)
    hang: HangSection = field(default_factory=HangSection)


def stages(cfg: Any) -> List[StageDef]:
    return [StageDef("train", "tests.hang_pipeline:train")]


def train(ctx: Any) -> dict:
    sys.path.insert(0, str(Path(__file__).parent))  # hang_workload sits beside this module
    import hang_workload

    return hang_workload.stall(ctx.stage_dir, ctx.cfg["hang"])


PIPELINE = PipelineDef("hang", HangConfig, stages)
