"""A one-stage pipeline training tests/elastic_workload.py's model through TrainLoop, under DDP or FSDP.

    hpc.pipeline.plan.PIPELINES["elastic"] = "tests.elastic_pipeline"; python -m hpc.submit elastic ...

Stage `train` runs elastic.steps optimizer steps of a 12-sample global batch (planned for the world
size the job got), checkpointing every elastic.save_every steps. Every attempt logs apart, under a
tag of its job id and restart count: ids-<tag><rank>.jsonl, loss<tag>.jsonl, and one line of
attempts.jsonl (tag, world size, nodes, step resumed from). elastic.hold_at=K makes every rank wait
before step K, up to hold_s, for a stop signal: a test preempts it there, mid-training, once the
checkpoint of step K-1 exists, with no race against the end of the run.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List

from hpc.config.schema import PipelineConfig, Resources
from hpc.pipeline.plan import PipelineDef, StageDef


@dataclass
class ElasticSection:
    strategy: str = "ddp"  # ddp | fsdp
    steps: int = 8  # two epochs of the 48-sample data set
    save_every: int = 1
    hold_at: int = 0  # 0: no hold
    hold_s: float = 120.0
    hold_once: bool = False  # hold only in an attempt that starts from scratch (not one resumed from a checkpoint)


@dataclass
class TrainOn2x2:
    """One stage, `train`: 2 nodes x 2 tasks for 5 minutes, signalled 30 s before (tests.hang_pipeline's too)."""

    train: Resources = field(default_factory=lambda: Resources(nodes=2, tasks_per_node=2, cpus_per_task=1,
                                                               time_min=5, signal_delay_s=30))


@dataclass
class ElasticConfig(PipelineConfig):
    stages: TrainOn2x2 = field(default_factory=TrainOn2x2)
    elastic: ElasticSection = field(default_factory=ElasticSection)


BATCH = (12, 6)  # elastic_workload's GLOBAL_BATCH, PER_DEVICE_MAX (that module imports torch: not at planning)


def stages(cfg: Any) -> List[StageDef]:
    return [StageDef("train", "tests.elastic_pipeline:train", batch=BATCH)]


def train(ctx: Any) -> dict:
    import torch

    import hpc.ddp

    sys.path.insert(0, str(Path(__file__).parent))  # elastic_workload imports its neighbours by name
    import elastic_workload

    torch.set_num_threads(1)
    cfg = ctx.cfg["elastic"]
    tag = f"{ctx.env.job_id}-{ctx.env.restart_count}-"

    def before_step(loop: Any, step: int) -> None:
        if step == loop.resumed_step + 1 and loop.s.is_main:
            with open(ctx.stage_dir / "attempts.jsonl", "a") as f:
                f.write(json.dumps({"tag": tag, "world_size": loop.s.world_size, "nodes": ctx.env.num_nodes,
                                    "resumed_from": loop.resumed_step}) + "\n")
        if step == cfg["hold_at"] and not (cfg["hold_once"] and loop.resumed_step):
            deadline = time.monotonic() + cfg["hold_s"]
            while loop.flag.reason is None and time.monotonic() < deadline:
                time.sleep(0.05)

    with hpc.ddp.session(timeout_s=120) as s:
        elastic_workload.train(s, ctx.stage_dir, cfg["strategy"], cfg["steps"], save_every=cfg["save_every"],
                               tag=tag, before_step=before_step)
        return {"world_size": s.world_size, "pid": os.getpid()}


PIPELINE = PipelineDef("elastic", ElasticConfig, stages)
