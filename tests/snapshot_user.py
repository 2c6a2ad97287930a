"""A user's pipeline in a git checkout of its own, for the code snapshot and run identity tests.

    repo = make_repo(tmp_path / "code", "v1"); python -m hpc.submit snapuser.pipe  (from repo)

Its one stage appends what it sees to <task>/attempts.jsonl, one line per attempt: the VERSION of
the module it imported, that module's file, its working directory and hpc's variables (run ids,
snapshot). With snap.wandb=true it logs to wandb in offline mode first. With snap.preempt_wait_s,
the first attempt waits that long for a preemption and requeues itself as hpc's own stages do.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PIPE = '''\
import json, os, time
from dataclasses import dataclass, field

from hpc.config.schema import PipelineConfig, Resources
from hpc.pipeline.plan import PipelineDef, StageDef

VERSION = "{version}"
SEEN = ("HPC_RUN_ID", "HPC_TASK_RUN_ID", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_RUN_GROUP", "MLFLOW_RUN_ID",
        "HPC_CODE_DIR", "HPC_SUBMIT_DIR", "SLURM_RESTART_COUNT")


@dataclass
class Section:
    preempt_wait_s: float = 0.0  # the first attempt waits this long for a preemption, then fails
    wandb: bool = False  # log to wandb, offline, in every attempt


@dataclass
class Stages:
    main: Resources = field(default_factory=lambda: Resources(cpus_per_task=1, time_min=5))


@dataclass
class Config(PipelineConfig):
    stages: Stages = field(default_factory=Stages)
    snap: Section = field(default_factory=Section)


def work(ctx):
    seen = {{"version": VERSION, "file": __file__, "cwd": os.getcwd(), **{{k: os.environ.get(k) for k in SEEN}}}}
    if ctx.cfg["snap"]["wandb"]:
        import wandb

        run = wandb.init(mode="offline", project="hpc-snapshot-test", dir=str(ctx.stage_dir))
        run.log({{"attempt": int(os.environ.get("SLURM_RESTART_COUNT") or 0)}})
        seen["wandb"] = {{"id": run.id, "group": run.group, "dir": run.dir}}
        run.finish()
    with open(ctx.stage_dir / "attempts.jsonl", "a") as fh:
        fh.write(json.dumps(seen) + "\\n")
    if ctx.cfg["snap"]["preempt_wait_s"] and (os.environ.get("SLURM_RESTART_COUNT") or "0") == "0":
        from hpc.recovery import preemption
        from hpc.recovery.stopsignal import StopFlag

        with StopFlag() as flag:
            deadline = time.monotonic() + ctx.cfg["snap"]["preempt_wait_s"]
            while flag.reason is None and time.monotonic() < deadline:
                time.sleep(0.1)
            if flag.reason is None:
                raise RuntimeError("the first attempt was not preempted in time")
            preemption.exit_for(preemption.handle_stop(flag.local(), history=ctx.stage_dir / "requeue.json"))
    return {{"version": VERSION}}


PIPELINE = PipelineDef("snapuser", Config, lambda cfg: [StageDef("main", "snapuser.pipe:work")])
'''


def set_version(repo: Path, version: str) -> None:
    (repo / "snapuser" / "pipe.py").write_text(PIPE.format(version=version))


def make_repo(repo: Path, version: str) -> Path:
    """The checkout: committed at version 'v0', then edited to `version` without a commit."""
    (repo / "snapuser").mkdir(parents=True)
    (repo / "snapuser" / "__init__.py").write_text("")
    set_version(repo, "v0")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "v0"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                       capture_output=True)
    set_version(repo, version)
    return repo


def forget() -> None:
    """Drop snapuser from this process's modules: each test's checkout is another one."""
    for name in [n for n in sys.modules if n == "snapuser" or n.startswith("snapuser.")]:
        del sys.modules[name]
