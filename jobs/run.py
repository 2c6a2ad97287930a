"""The `run` pipeline: a user's torchrun-style script as one (multi-node) SLURM job.

    python -m hpc.submit run --nodes 2 --gpus-per-node 8 -- python train.py --lr 1e-3

Every task runs `python -m hpc.launch -- CMD`, which exports RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT from SLURM's variables, in the task's working
directory <run>/main/work (hpc.scripts.workspace: the code as submitted, git-ignored data from the
submit directory, outputs kept across attempts). HPC_CHECKPOINT_DIR names <run>/main/checkpoints:
after a preemption the job is requeued and the script resumes from there, or from its own outputs.
"""
from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List

from hpc.config.schema import ConfigError, PipelineConfig, Resources, to_dict
from hpc.container import spec
from hpc.pipeline.options import QUOTED, REST, SWITCH, Option
from hpc.pipeline.plan import PipelineDef, StageDef
from hpc.recovery import scriptproc
from hpc.scripts import accelerate_cfg, checks, presets, resume
from hpc.slurm import noderange


@dataclass
class ScriptSection:
    command: List[str] = field(default_factory=list)  # the program and its arguments (after `--`)
    # RANK, WORLD_SIZE, MASTER_* exported (torchrun's variables); false for a one-process script that
    # takes a DDP path whenever RANK is set (nanoGPT: NCCL, so CUDA, on a CPU node)
    rank_env: bool = True
    # How the script hears of the time limit (SLURM's --signal=USR2@N reaches this wrapper): TERM
    # (what plain scripts save on), USR1 (Lightning's requeue signal), USR2 (left to the script), or
    # none. A preemption's SIGTERM reaches the script from SLURM in any case.
    warn_signal: str = ""  # "": the framework preset's (TERM for a plain script)
    # The framework preset (hpc.scripts.presets): auto (from the script's imports), lightning, hf,
    # accelerate, torchtitan or none
    framework: str = "auto"
    accelerate_config: str = ""  # framework accelerate, per rank: the `accelerate config` file ("": its default)
    env: Dict[str, str] = field(default_factory=dict)  # more variables for the script (settle fills Accelerate's)
    # The hang watchdog (hpc.scripts.scriptwatch): no progress in rank 0's output (or no new line matching
    # `heartbeat`, a regular expression) for this long is a hang: stacks of every rank, then a requeue. 0: off
    hang_after_s: float = 1800.0
    heartbeat: str = ""
    # The resume contract (hpc.scripts.resume): a pattern of the script's checkpoints, relative to its
    # working directory, and the arguments added when a complete one matches ($HPC_LAST_CHECKPOINT ...)
    resume_if: str = ""
    resume_args: List[str] = field(default_factory=list)
    keep_every_s: float = 30.0  # how often a checkpoint overwritten in place is looked at, to keep a copy


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
    check_resume(cfg.script)
    if cfg.script.warn_signal not in ("", *scriptproc.WARN_SIGNALS):
        raise ConfigError(f"script.warn_signal={cfg.script.warn_signal!r}; expected one of "
                          f"{', '.join(scriptproc.WARN_SIGNALS)}. HINT: --warn-signal TERM (the default)")
    if cfg.script.framework not in presets.FRAMEWORKS:
        raise ConfigError(f"script.framework={cfg.script.framework!r}; expected one of "
                          f"{', '.join(presets.FRAMEWORKS)}. HINT: --framework auto (the default) reads the "
                          "script's imports")
    preset = presets.choose(cfg.script.framework, list(cfg.script.command), Path.cwd())
    if not in_container(cfg):  # in an image the script's interpreter is the image's, not this machine's
        checks.check_importable(preset, list(cfg.script.command))
    checks.check_world_sizes(preset, list(cfg.script.command), noderange.bounds(cfg.stages.main.nodes),
                             cfg.stages.main.tasks_per_node)


def settle(cfg: Any) -> bool:
    """`auto` becomes the framework the script's imports name; an Accelerate script gets its config
    file's variables (per rank) or one task per node (per node, `accelerate launch`). Reads the
    script and the config file, so the result is never cached."""
    script = cfg.script
    if script.framework == "auto":
        script.framework = presets.detect(list(script.command), Path.cwd())
    if script.framework == "accelerate":
        if accelerate_cfg.is_launcher(list(script.command)):
            cfg.stages.main.tasks_per_node = 1  # the launcher starts the node's processes
            script.rank_env = False  # it sets its own rank variables
        else:
            script.env = {**accelerate_cfg.environ(accelerate_cfg.read_config(script.accelerate_config or None)),
                          **script.env}
    return False


def in_container(cfg: Any) -> str:
    """The runtime of the container the script's ranks run in ('': this machine's interpreter)."""
    return str(spec.effective(to_dict(cfg.stages.main.container), to_dict(cfg.cluster.container))
               .get("runtime") or "")


def notes(cfg: Any) -> List[str]:
    script = cfg.script
    lines = [f"framework preset: {script.framework} (hpc.scripts.presets); the script runs in <run>/main/work"]
    if in_container(cfg) and presets.choose(script.framework, list(script.command), Path.cwd()).packages:
        lines.append(f"framework preset {script.framework}: whether the image's interpreter imports it is not "
                     "checked here (the script runs in the container); the job's log says if it cannot")
    if script.env:
        lines.append(f"script environment: {', '.join(f'{k}={v}' for k, v in sorted(script.env.items()))}")
    if script.resume_if:
        lines.append(f"resume: {shlex.join(list(script.resume_args))} when {script.resume_if} holds a complete "
                     "checkpoint")
    return lines


def check_resume(script: Any) -> None:
    """The resume contract's mistakes, before anything is submitted."""
    unknown = resume.unknown_placeholders([*script.command, *script.resume_args, script.resume_if])
    if unknown:
        raise ConfigError(f"unknown placeholder(s) {', '.join('$' + u for u in unknown)}; expected "
                          f"{', '.join('$' + p for p in resume.PLACEHOLDERS)}. HINT: quote the argument in "
                          "single quotes so that your shell leaves $HPC_... for hpc to expand")
    if script.resume_args and not script.resume_if.strip():
        raise ConfigError("--resume-args without --resume-if: hpc cannot tell when to add them. HINT: "
                          "--resume-if 'out/ckpt.pt' (a pattern of the checkpoints your script writes)")
    pattern = script.resume_if.strip()
    if pattern.endswith(".py") or pattern.startswith(("code/", "./code/")):
        raise ConfigError(f"--resume-if {pattern!r} names code, which is linked read-only from the snapshot and "
                          "is never a checkpoint. HINT: the pattern of the files your script saves, e.g. "
                          "'out/checkpoint-*'")
    if script.heartbeat:
        try:
            re.compile(script.heartbeat)
        except re.error as err:
            raise ConfigError(f"--heartbeat {script.heartbeat!r} is not a regular expression ({err}). HINT: e.g. "
                              "--heartbeat 'step [0-9]+'") from None
    if script.hang_after_s < 0:
        raise ConfigError(f"script.hang_after_s={script.hang_after_s}: expected seconds >= 0 (0 turns the hang "
                          "watchdog off). HINT: --hang-after 1800")
    if "HPC_LAST_CHECKPOINT" in " ".join(script.command):
        raise ConfigError("$HPC_LAST_CHECKPOINT in the command: it is empty on the first attempt. HINT: put the "
                          "argument that names it in --resume-args, which is added only when one exists")


def stages(cfg: Any) -> List[StageDef]:
    launch = ["python", "-m", "hpc.launch", *([] if cfg.script.rank_env else ["--no-env"]), "--"]
    command = shlex.join([*launch, *cfg.script.command])
    return [StageDef("main", "hpc.jobs.run:run_command", describe=f"{command}  (argv, no shell)")]


def run_command(ctx: Any) -> dict:
    """The task: the script in its working directory (hpc.scripts.workspace), resumed by the contract
    of hpc.scripts.resume, under the runner."""
    import contextlib

    from hpc.scripts import hooks, workspace  # the script's task only, never when planning
    from hpc.scripts.runner import run_argv

    script = ctx.cfg["script"]
    code, live = workspace.code_dirs()
    preset = presets.choose(script.get("framework", "none"), list(script["command"]), code or live)
    resume_if = script.get("resume_if") or preset.resume_if
    work, plan = workspace.prepare(ctx, resume_if)
    values = workspace.placeholders(ctx, work, plan.get("last") or "")
    argv = resume.expand(workspace.map_paths(list(script["command"]), work, live, code), values)
    if preset.name == "accelerate" and accelerate_cfg.is_launcher(argv):
        argv = accelerate_cfg.launcher_argv(argv, ctx.env, int(ctx.cfg["stages"]["main"]["gpus_per_node"]))
    for before, after, why in plan.get("set_aside", []):
        print(f"[hpc] set aside {before} -> {after}: {why}", file=sys.stderr, flush=True)
    if plan.get("last"):
        argv += resume.expand(list(script.get("resume_args") or []), values)
        print(f"[hpc] resuming from {plan['last']}: {shlex.join(argv)}", file=sys.stderr, flush=True)
    elif resume_if:
        print(f"[hpc] no complete checkpoint matches {resume_if}: starting fresh", file=sys.stderr, flush=True)
    keeper: Any = contextlib.nullcontext()
    if resume_if and ctx.env.rank == 0 and not resume.is_pattern(resume_if):
        target = resume.expand([resume_if], values)[0]
        keeper = resume.Keeper(Path(target if os.path.isabs(target) else work / target), Path(ctx.stage_dir),
                               float(script.get("keep_every_s", 30.0)))
    env = {**dict(script.get("env") or {}), **{k: v for k, v in values.items() if k != "HPC_CHECKPOINT_DIR"},
           **preset.environ(ctx.env.num_nodes, ctx.env.local_world_size),
           **hooks.environ(preset, ctx.stage_dir, os.environ.get("PYTHONPATH", ""))}
    print(f"[hpc] framework preset: {preset.name}", file=sys.stderr, flush=True)
    with keeper:
        return run_argv(ctx, argv, ctx.cfg["stages"]["main"]["max_timeouts"], launch=script.get("rank_env", True),
                        warn=script.get("warn_signal") or preset.warn, cwd=work, env=env,
                        preempt_as=preset.preempt_as, watch=workspace.watch_factory(ctx, script))


def count_or_range(value: Any) -> Any:
    """--nodes 2 is the count 2, --nodes 1-2 the range (checked with the config: hpc.slurm.noderange)."""
    return int(value) if str(value).isdigit() else str(value)


# python -m hpc.submit run's own options, hpc.submit("run", ...)'s keywords (hpc.pipeline.options)
OPTIONS = (
    Option("nodes", "stages.main.nodes", "nodes per job, or a range MIN-MAX (e.g. 1-2)", count_or_range),
    Option("gpus_per_node", "stages.main.gpus_per_node", "GPUs (and ranks) per node", int,
           also=lambda n, given: {"stages.main.tasks_per_node": max(1, n)}),
    Option("tasks_per_node", "stages.main.tasks_per_node",
           "processes (ranks) per node; without --gpus-per-node they are CPU ranks (no GPUs)", int,
           also=lambda n, given: {} if "gpus_per_node" in given else {"stages.main.gpus_per_node": 0}),
    Option("pack", "stages.main.pack", "with --sweep: this many points side by side in one job of as many times "
           "the point's resources (docs/pipelines.md)", int, metavar="K"),
    Option("rank_env", "script.rank_env", "export no RANK/WORLD_SIZE/MASTER_* variables (a one-process script "
           "that would otherwise take its DDP path)", form=SWITCH, flag="--no-rank-env", switch=False),
    Option("resume_if", "script.resume_if", "the script's checkpoints, relative to its working directory; before "
           "each launch incomplete ones are set aside and --resume-args added if a complete one is left",
           metavar="GLOB"),
    Option("resume_args", "script.resume_args", "arguments added when --resume-if matches a complete checkpoint, "
           "in one quoted string ('--resume_from_checkpoint $HPC_LAST_CHECKPOINT')", form=QUOTED, metavar="ARGS"),
    Option("framework", "script.framework", "the script's framework preset (default auto: from the script's "
           "imports)", choices=("auto", "lightning", "hf", "accelerate", "torchtitan", "none")),
    Option("accelerate_config", "script.accelerate_config", "framework accelerate: the `accelerate config` file "
           "whose settings every rank gets (default: Accelerate's own default file, if there is one)", metavar="FILE"),
    Option("hang_after_s", "script.hang_after_s", "no progress in rank 0's output this long is a hang: stacks of "
           "every rank, then a requeue (default 1800; 0: off; before the first progress: at least 300)", float,
           flag="--hang-after", metavar="SECONDS"),
    Option("heartbeat", "script.heartbeat", "progress is a new line of rank 0's output matching this, not any "
           "output", metavar="REGEX"),
    Option("warn_signal", "script.warn_signal", "the signal the script gets when its time limit is near "
           "(default TERM)", choices=("TERM", "USR1", "USR2", "none")),
    Option("command", "script.command", "the script's command line, run as an argv (no shell)", form=REST,
           metavar="COMMAND ..."),
)
PIPELINE = PipelineDef("run", RunConfig, stages, validate, templates=("run.yaml",), notes=notes, settle=settle,
                       options=OPTIONS)
