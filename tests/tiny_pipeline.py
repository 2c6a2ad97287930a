"""A tiny two- (or three-) stage pipeline for testing the pipeline machinery (no torch, seconds per task).

    hpc.pipeline.plan.PIPELINES["tiny"] = "tests.tiny_pipeline"; python -m hpc.submit tiny ...

Stage `first` (one task) writes first.txt; stage `second` (an array over tiny.parts) writes
out-<item>.txt; stage `third` (tiny.third=true) checks them all; stage `follow` (tiny.follow=true),
an array over the same parts, checks its own item's output: item k waits only for second[k]
(per_item_after). Tasks fail on demand (tiny.fail_first, tiny.fail_items) to exercise afterok,
status and resubmission.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List

from hpc.config.schema import PipelineConfig, Resources
from hpc.pipeline.plan import PipelineDef, StageDef


@dataclass
class TinySection:
    parts: List[int] = field(default_factory=lambda: [0, 1, 2])  # array items of stage `second`
    fail_first: bool = False  # stage `first` raises
    fail_items: List[int] = field(default_factory=list)  # these items of `second` raise
    sleep_s: float = 0.0  # time each task spends working
    fail_rank: int = -1  # this rank of every `second` task raises at once; the others hang (-1: none)
    slow_items: List[int] = field(default_factory=list)  # these items of `second` work slow_s longer
    slow_s: float = 20.0
    release_file: str = ""  # when set, slow items wait until this file exists instead of slow_s
    third: bool = False  # add stage `third`, after `second`: it checks that every item's output exists
    follow: bool = False  # add stage `follow`, item k after second[k]: it checks that item's output exists
    score: float = 0.0  # each `second` task writes it to its metrics.json (a metric for sweeps)


@dataclass
class TinyStages:
    first: Resources = field(default_factory=lambda: Resources(cpus_per_task=1, time_min=5))
    second: Resources = field(default_factory=lambda: Resources(cpus_per_task=1, time_min=5))
    third: Resources = field(default_factory=lambda: Resources(cpus_per_task=1, time_min=5))
    follow: Resources = field(default_factory=lambda: Resources(cpus_per_task=1, time_min=5))


@dataclass
class TinyConfig(PipelineConfig):
    stages: TinyStages = field(default_factory=TinyStages)
    tiny: TinySection = field(default_factory=TinySection)


def stages(cfg: Any) -> List[StageDef]:
    out = [StageDef("first", "tests.tiny_pipeline:first"),
           StageDef("second", "tests.tiny_pipeline:second", items=tuple(cfg.tiny.parts), after=("first",))]
    if cfg.tiny.third:
        out.append(StageDef("third", "tests.tiny_pipeline:third", after=("second",)))
    if cfg.tiny.follow:
        out.append(StageDef("follow", "tests.tiny_pipeline:follow", items=tuple(cfg.tiny.parts),
                            per_item_after="second"))
    return out


def first(ctx: Any) -> dict:
    time.sleep(ctx.cfg["tiny"]["sleep_s"])
    if ctx.cfg["tiny"]["fail_first"]:
        raise RuntimeError("first: failing on request (tiny.fail_first=true)")
    (ctx.stage_dir / "first.txt").write_text(f"rank {ctx.env.rank}\n")
    return {"ok": True}


def second(ctx: Any) -> dict:
    assert (ctx.run_dir / "first" / "first.txt").exists(), "second started before first finished"
    print(f"progress: item {ctx.item} working", flush=True)
    if ctx.env.rank == ctx.cfg["tiny"]["fail_rank"]:
        raise RuntimeError(f"second: rank {ctx.env.rank} failing on request (tiny.fail_rank)")
    if ctx.cfg["tiny"]["fail_rank"] >= 0:
        time.sleep(600)  # a peer that would wait forever in a collective: srun must end it
    time.sleep(ctx.cfg["tiny"]["sleep_s"])
    if ctx.item in ctx.cfg["tiny"]["slow_items"]:
        _slow(ctx.cfg["tiny"])
    if ctx.item in ctx.cfg["tiny"]["fail_items"]:
        raise RuntimeError(f"second: item {ctx.item} failing on request (tiny.fail_items)")
    (ctx.stage_dir / f"out-{ctx.item}.txt").write_text(f"{ctx.item} rank {ctx.env.rank}\n")
    (ctx.stage_dir / "metrics.json").write_text(json.dumps({"score": ctx.cfg["tiny"]["score"]}))
    return {"item": ctx.item}


def _slow(tiny: dict) -> None:
    release = Path(tiny["release_file"]) if tiny["release_file"] else None
    if release is None:
        time.sleep(tiny["slow_s"])
    while release is not None and not release.exists():  # the test lets it go; its time limit ends it
        time.sleep(0.2)


def follow(ctx: Any) -> dict:
    out = ctx.run_dir / "second" / f"task-{ctx.item}" / f"out-{ctx.item}.txt"
    assert out.exists(), f"follow[{ctx.item}] started before second[{ctx.item}] wrote {out}"
    return {"item": ctx.item}


def third(ctx: Any) -> dict:
    missing = [i for i in ctx.cfg["tiny"]["parts"]
               if not (ctx.run_dir / "second" / f"task-{i}" / f"out-{i}.txt").exists()]
    assert not missing, f"third started before second wrote items {missing}"
    return {"ok": True}


PIPELINE = PipelineDef("tiny", TinyConfig, stages)
