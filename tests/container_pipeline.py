"""Two one-stage pipelines whose jobs run with no SLURM client in reach (the `exec` runtime under
bubblewrap: tests/slurm/test_container_exec.py), and live through every stop:

    hpc.pipeline.plan.PIPELINES["box"] = "tests.container_pipeline"; python -m hpc.submit box --cluster slurm ...

`box`: a 1 x 2 TrainLoop job. Attempt by attempt (SLURM_RESTART_COUNT): 0 is preempted by the test,
1 has rank box.stop_rank stop itself (SIGSTOP) once a checkpoint of its own is committed, which the
watchdog of the other rank turns into a requeue, 2 trains to box.steps and ends. `LIMIT`: a one-task
stage without a TrainLoop, at a 2-minute time limit: submitit's own handler of the time-limit
signal checkpoints it and asks for a requeue, once (max_timeouts=1); at the second, over the cap,
the job ends. Each rank writes what it sees of SLURM and where it imported hpc from (seen-R-A.json),
and where each attempt started (start-R-A.json).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, List

from hpc.config.schema import PipelineConfig, Resources
from hpc.pipeline.plan import PipelineDef, StageDef

CLIENTS = ("scontrol", "sbatch", "srun", "scancel", "squeue", "sacct")


@dataclass
class BoxSection:
    steps: int = 30
    step_s: float = 0.2
    watchdog_s: float = 3.0
    stop_rank: int = 1
    hang_attempt: int = 1


@dataclass
class BoxStages:
    train: Resources = field(default_factory=lambda: Resources(nodes=1, tasks_per_node=2, cpus_per_task=1, time_min=5,
                                                               partition="low", extra={"nodelist": "n1"}))
    # SLURM sends the warning to the job's steps at its first look at the job (about every 30 s, later
    # on a busy machine) once the limit is within signal_delay_s + 30 s. A warning due at the start (a
    # 1-minute limit) reaches no step when that look comes before the boxed step has started, and the
    # job runs into its limit. Due 30 s after the start, it leaves the step that long to start and the
    # job a minute after it.
    wait: Resources = field(default_factory=lambda: Resources(
        cpus_per_task=1, time_min=2, signal_delay_s=60, max_timeouts=1, partition="low", extra={"nodelist": "n2"}))


@dataclass
class BoxConfig(PipelineConfig):
    stages: BoxStages = field(default_factory=BoxStages)
    box: BoxSection = field(default_factory=BoxSection)


def stages(cfg: Any) -> List[StageDef]:
    return [StageDef("train", "tests.container_pipeline:train")]


def limit_stages(cfg: Any) -> List[StageDef]:
    return [StageDef("wait", "tests.container_pipeline:wait")]


def slurm_seen() -> dict:
    """What this process finds of SLURM's clients: on PATH, and when run from where they are installed."""
    found = {name: shutil.which(name) for name in CLIENTS}
    try:
        subprocess.run(["/usr/bin/scontrol", "ping"], capture_output=True, timeout=10)
        ran = True
    except OSError:
        ran = False
    return {"on_path": {k: v for k, v in found.items() if v}, "scontrol_ran": ran}


def seen() -> dict:
    """What this rank reaches of SLURM, and where it imported hpc and its pure-Python requirements from."""
    tops = ("hpc", "submitit", "cloudpickle", "omegaconf", "antlr4", "yaml", "tqdm")
    return {"slurm": slurm_seen(), "imported": {n: getattr(sys.modules[n], "__file__", None) or "?" for n in tops
                                                if n in sys.modules}}


def train(ctx: Any) -> dict:
    import torch

    from hpc import ddp
    from hpc.trainloop import TrainLoop

    cfg, out = ctx.cfg["box"], ctx.stage_dir
    with ddp.session(timeout_s=60, train_timeout_s=30) as s:
        attempt = s.env.restart_count
        (out / f"seen-{s.rank}-{attempt}.json").write_text(json.dumps(seen()))
        torch.manual_seed(0)
        model = s.wrap(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with TrainLoop(s, out, save_every=1, tensorboard=False, watchdog_s=cfg["watchdog_s"],
                       max_timeouts=ctx.cfg["stages"]["train"]["max_timeouts"]) as loop:
            start = loop.resume({"model": model, "optimizer": opt})
            (out / f"start-{s.rank}-{attempt}.json").write_text(json.dumps({"step": start, "time": time.time()}))
            for step in loop.steps(cfg["steps"]):
                loss = model(torch.full((8, 4), float(step % 7))).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                if s.rank == cfg["stop_rank"] and attempt == cfg["hang_attempt"] and step >= start + 2:
                    while loop.store.latest() is None or loop.store.latest() <= start:
                        time.sleep(0.05)  # a checkpoint of this attempt to resume from, then the hang
                    os.kill(os.getpid(), signal.SIGSTOP)
                time.sleep(cfg["step_s"])
        return {"rank": s.rank, "step": loop.step}


def wait(ctx: Any) -> None:
    """Sleeps into its time limit, each attempt; StageTask.checkpoint() resubmits it (a requeue)."""
    attempt, out = os.environ.get("SLURM_RESTART_COUNT", "0"), ctx.stage_dir
    (out / f"seen-0-{attempt}.json").write_text(json.dumps(seen()))
    (out / f"start-0-{attempt}.json").write_text(json.dumps({"time": time.time()}))
    time.sleep(3600)


PIPELINE = PipelineDef("box", BoxConfig, stages)
LIMIT = PipelineDef("boxlimit", BoxConfig, limit_stages)
