"""A one-stage pipeline whose array items each train a small float64 model through TrainLoop, for
packed jobs' preemption and resume on the local cluster (tests/slurm/test_packing.py).

    hpc.pipeline.plan.PIPELINES["pk"] = "tests.pack_pipeline"; python -m hpc.submit pk --cluster slurm ...

Item i starts from seed i and trains on batches drawn from seed (i, step): the same weights whatever
the job it runs in, packed or not, preempted or not. It saves every step; rank 0 writes progress.json
(its last step) after each step and one line per attempt to attempts.jsonl (the job, the restart
count, the first step it trained); pk.short_items train pk.short_steps only; the final weights go to
weights.pt.

pk.chain=true trains no model: item i's steps extend a sha256 chain from "item i", its state saved
atomically to its checkpoints/chain.json after each step and resumed from there; the last digest goes
to result.txt. Such an item starts in milliseconds (no torch), so a test can pack 16 of them; a
stop kills it (no agreed step) and its next attempt resumes from its last saved step. pk.fail_items
raise at once.
"""
from __future__ import annotations

import hashlib
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
    chain: bool = False  # items extend a sha256 chain (no torch) instead of training a model
    fail_items: List[int] = field(default_factory=list)  # these items raise at their start


@dataclass
class PkStages:
    train: Resources = field(default_factory=lambda: Resources(cpus_per_task=1, gpus_per_node=1, time_min=5,
                                                               partition="low"))


@dataclass
class PkConfig(PipelineConfig):
    stages: PkStages = field(default_factory=PkStages)
    pk: PkSection = field(default_factory=PkSection)


def stages(cfg: Any) -> List[StageDef]:
    target = "tests.pack_pipeline:chain" if cfg.pk.chain else "tests.pack_pipeline:train"
    return [StageDef("train", target, items=tuple(cfg.pk.parts))]


def record_attempt(ctx: Any, first: int) -> None:
    import hpc  # where this rank imports hpc from: the checkout, or a container's carried copy

    with open(ctx.stage_dir / "attempts.jsonl", "a") as f:
        f.write(json.dumps({"job": ctx.env.job_id, "restart": ctx.env.restart_count, "first": first,
                            "hpc": os.path.dirname(hpc.__file__)}) + "\n")


def save(path: Any, state: dict) -> None:
    path.with_suffix(".tmp").write_text(json.dumps(state))
    os.replace(path.with_suffix(".tmp"), path)


def chain(ctx: Any) -> dict:
    cfg, out = ctx.cfg["pk"], ctx.stage_dir
    steps = cfg["short_steps"] if ctx.item in cfg["short_items"] else cfg["steps"]
    saved = out / "checkpoints" / "chain.json"
    saved.parent.mkdir(exist_ok=True)
    state = json.loads(saved.read_text()) if saved.exists() else {"step": 0, "digest": f"item {ctx.item}"}
    record_attempt(ctx, state["step"] + 1)
    if ctx.item in cfg["fail_items"]:
        raise RuntimeError(f"item {ctx.item} failing on request (pk.fail_items)")
    for step in range(state["step"] + 1, steps + 1):
        state = {"step": step, "digest": hashlib.sha256(f"{state['digest']}:{step}".encode()).hexdigest()}
        time.sleep(cfg["step_s"])
        save(saved, state)
        save(out / "progress.json", {"step": step})
    (out / "result.txt").write_text(state["digest"])
    return {"step": steps}


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
                record_attempt(ctx, loop.resumed_step + 1)
            for step in loop.steps(steps):
                batch = torch.randn(8, 4, generator=torch.Generator().manual_seed(1000 * ctx.item + step)).double()
                opt.zero_grad()
                model(batch).pow(2).mean().backward()
                opt.step()
                time.sleep(cfg["step_s"])
                if s.is_main:
                    save(out / "progress.json", {"step": step})
        if s.is_main:
            torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out / "weights.pt")
    return {"step": steps}


PIPELINE = PipelineDef("pk", PkConfig, stages)
