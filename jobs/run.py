"""The `run` pipeline: a user's torchrun-style script as one (multi-node) SLURM job.

    python -m hpc.submit run --nodes 2 --gpus-per-node 8 -- python train.py --lr 1e-3

Every task runs `python -m hpc.launch -- CMD`, which exports RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT from SLURM's variables. HPC_CHECKPOINT_DIR names
<run>/main/checkpoints: after a preemption SLURM requeues the job and the script resumes from there.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, List

from hpc.config import ConfigError, PipelineConfig, Resources
from hpc.plan import PipelineDef, StageDef


@dataclass
class ScriptSection:
    command: List[str] = field(default_factory=list)  # the program and its arguments (after `--`)


@dataclass
class RunStages:
    main: Resources = field(default_factory=Resources)


@dataclass
class RunConfig(PipelineConfig):
    stages: RunStages = field(default_factory=RunStages)
    script: ScriptSection = field(default_factory=ScriptSection)


def validate(cfg: Any) -> None:
    if not cfg.script.command:
        raise ConfigError("no command given; expected one after '--'. "
                          "HINT: python -m hpc.submit run --nodes 1 --gpus-per-node 2 -- python train.py")


def stages(cfg: Any) -> List[StageDef]:
    import shlex

    command = shlex.join(["python", "-m", "hpc.launch", "--", *cfg.script.command])
    return [StageDef("main", "hpc.jobs.run:run_command", describe=f"{command}  (argv, no shell)")]


def run_command(ctx: Any) -> dict:
    return run_argv(ctx, list(ctx.cfg["script"]["command"]), ctx.cfg["stages"]["main"]["max_timeouts"])


def run_argv(ctx: Any, argv: List[str], max_timeouts: int, launch: bool = True) -> dict:
    """Run argv (no shell) in this task, under `python -m hpc.launch --` for torchrun-style variables."""
    from hpc import preemption

    checkpoints = ctx.stage_dir / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HPC_CHECKPOINT_DIR": str(checkpoints), "HPC_RUN_DIR": str(ctx.run_dir)}
    cmd = [sys.executable, "-m", "hpc.launch", "--", *argv] if launch else argv
    # SLURM signals every process of the step: the script gets SIGTERM/SIGUSR2 itself (and may
    # checkpoint); this wrapper only notes it, and requeues once the script has exited.
    flag = preemption.install()
    code = subprocess.call(cmd, env=env)
    if _killed_by_stop_signal(code, flag):
        _await_own_signal(flag)
    if flag.reason:
        requeue_after_stop(ctx, flag, checkpoints, max_timeouts)
    if code != 0:
        raise RuntimeError(f"command {cmd} exited with status {code} on rank {ctx.env.rank}")
    return {"exit_code": code}


def _killed_by_stop_signal(code: int, flag: Any) -> bool:
    """Did the script die of a signal that also means a stop for this wrapper?"""
    signum = -code if code < 0 else code - 128 if code > 128 else 0
    return signum in flag.kinds


def _await_own_signal(flag: Any, timeout_s: float = 5.0) -> None:
    """SLURM signals the step's processes one by one: the script may die of its SIGTERM before this
    wrapper's own copy has arrived and run its handler. Give it a moment rather than mistake a
    preemption for a failure (the sleep is cut short by the signal, and the handler runs)."""
    import time

    deadline = time.monotonic() + timeout_s
    while flag.reason is None and time.monotonic() < deadline:
        time.sleep(0.05)


def requeue_after_stop(ctx: Any, flag: Any, checkpoints: Any, max_timeouts: int) -> None:
    """A job that ends within GraceTime is not requeued by SLURM 22.05: rank 0 asks for it."""
    import time

    from hpc import preemption

    if ctx.env.rank != 0:
        time.sleep(30)  # rank 0's requeue ends this task; leaving first could end the job as FAILED
        raise SystemExit(-1)
    decision = preemption.handle_stop(flag.local(), history=checkpoints / "requeue.json",
                                      max_timeouts=max_timeouts)
    preemption.exit_for(decision)


PIPELINE = PipelineDef("run", RunConfig, stages, validate, templates=("run.yaml",))
