"""The `run` pipeline: a user's torchrun-style script as one (multi-node) SLURM job.

    python -m hpc.submit run --nodes 2 --gpus-per-node 8 -- python train.py --lr 1e-3

Every task runs `python -m hpc.launch -- CMD`, which exports RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT from SLURM's variables, in the task's working
directory <run>/main/work (hpc.scripts.workspace: the code as submitted, git-ignored data from the
submit directory, outputs kept across attempts). HPC_CHECKPOINT_DIR names <run>/main/checkpoints:
after a preemption the job is requeued and the script resumes from there, or from its own outputs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List

from hpc.config.schema import ConfigError, PipelineConfig, Resources
from hpc.pipeline.plan import PipelineDef, StageDef
from hpc.recovery import scriptproc


@dataclass
class ScriptSection:
    command: List[str] = field(default_factory=list)  # the program and its arguments (after `--`)
    # RANK, WORLD_SIZE, MASTER_* exported (torchrun's variables); false for a one-process script that
    # takes a DDP path whenever RANK is set (nanoGPT: NCCL, so CUDA, on a CPU node)
    rank_env: bool = True
    # How the script hears of the time limit (SLURM's --signal=USR2@N reaches this wrapper): TERM
    # (what plain scripts save on), USR1 (Lightning's requeue signal), USR2 (left to the script), or
    # none. A preemption's SIGTERM reaches the script from SLURM in any case.
    warn_signal: str = "TERM"


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
    if cfg.script.warn_signal not in scriptproc.WARN_SIGNALS:
        raise ConfigError(f"script.warn_signal={cfg.script.warn_signal!r}; expected one of "
                          f"{', '.join(scriptproc.WARN_SIGNALS)}. HINT: --warn-signal TERM (the default)")


def stages(cfg: Any) -> List[StageDef]:
    import shlex

    launch = ["python", "-m", "hpc.launch", *([] if cfg.script.rank_env else ["--no-env"]), "--"]
    command = shlex.join([*launch, *cfg.script.command])
    return [StageDef("main", "hpc.jobs.run:run_command", describe=f"{command}  (argv, no shell)")]


def run_command(ctx: Any) -> dict:
    """The task: the script in its working directory (hpc.scripts.workspace), under the runner."""
    from hpc.scripts import workspace  # the script's task only, never when planning
    from hpc.scripts.runner import run_argv

    script = ctx.cfg["script"]
    work = workspace.prepare(ctx)
    code, live = workspace.code_dirs()
    argv = workspace.map_paths(list(script["command"]), work, live, code)
    return run_argv(ctx, argv, ctx.cfg["stages"]["main"]["max_timeouts"], launch=script.get("rank_env", True),
                    warn=script.get("warn_signal", "TERM"), cwd=work, env={"HPC_WORK_DIR": str(work)})


PIPELINE = PipelineDef("run", RunConfig, stages, validate, templates=("run.yaml",))
