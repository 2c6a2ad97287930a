"""Resources -> submitit executor parameters, and the sbatch text they produce.

    python -m hpc.submit langsplat --cluster slurm --dry-run    # prints what render() returns

The dry-run text is made by submitit's own script builder from the very parameters the submitter
passes to the executor, so what is printed is what sbatch receives. Every value goes through
shlex.quote there; config values were already restricted to plain tokens in hpc.config.schema.
"""
from __future__ import annotations

import json
import re
import shlex
import sys
from typing import Any, Dict, Mapping, Optional, Sequence

from hpc.config import defaults
from hpc.config.checks import ConfigError
from hpc.container import spec
from hpc.pipeline import arrays
from hpc.slurm import noderange

MAIL = re.compile(r"[A-Za-z0-9_.+-]+(@[A-Za-z0-9.-]+)?")  # notify.mail: user@site, or a user name


def slurm_parameters(res: Mapping[str, Any], job_name: str, dependency: Optional[str] = None,
                     setup: Sequence[str] = (), run_dir: Optional[str] = None,
                     task_ids: Sequence[int] = (), points: Optional[str] = None,
                     tasks: Optional[str] = None) -> Dict[str, Any]:
    """Parameters for submitit.SlurmExecutor.update_parameters(); with `run_dir`, srun runs under
    hpc.afterstep (node failures, node ranges after a requeue); with `task_ids`, an array of those
    task ids (hpc.pipeline.executor.submit_array submits it) instead of submitit's 0..n-1;
    `points`: a sweep array's file naming each task's point (hpc.rundir.sweepdir.SweepDir.write_points);
    `tasks`: an array's file of its tasks' pickles (hpc.pipeline.arraytasks)."""
    # spare nodes: the job holds them beyond its training nodes, and survives a node's loss (--no-kill):
    # hpc.afterstep trains on `nodes` of them and restarts on healthy ones in place (hpc.recovery.inplace)
    spare = int(res.get("spare_nodes") or 0)
    lo, hi = (n + spare for n in noderange.bounds(res["nodes"]))
    params: Dict[str, Any] = {
        "job_name": job_name,
        # submitit counts the job's tasks from an integer: the fewest it may get (a range goes below)
        "nodes": lo,
        "ntasks_per_node": res["tasks_per_node"],
        "cpus_per_task": res["cpus_per_task"],
        "time": res["time_min"],
        # SIGUSR2, not USR1: NCCL may catch USR1 (submitit's note); the stage checkpoints on it.
        "signal_delay_s": res["signal_delay_s"],
    }
    if res["gpus_per_node"]:
        params["gpus_per_node"] = res["gpus_per_node"]
    if res.get("array_parallelism"):  # the %P of --array=0-N%P; a job that is no array ignores it
        params["array_parallelism"] = res["array_parallelism"]
    for key in ("mem", "partition", "account", "qos", "constraint"):
        if res.get(key) is not None:
            params[key] = res[key]
    # requeue: a preempted job (PreemptMode=REQUEUE) comes back with the same id and resumes.
    extra: Dict[str, Any] = {"requeue": True, **({"no_kill": True} if spare else {}), **dict(res.get("extra") or {})}
    if hi != lo:  # overrides submitit's --nodes line: sbatch --nodes=MIN-MAX
        extra["nodes"] = noderange.show((lo, hi))
    if dependency:
        extra["dependency"] = dependency
        # SLURM keeps a job whose dependency can never be satisfied (an afterok on a failed job)
        # pending forever, unless told to end it: nobody may be watching after a submission.
        if not any(k.replace("-", "_") == "kill_on_invalid_dep" for k in extra):
            extra["kill_on_invalid_dep"] = "yes"
    if task_ids:  # overrides submitit's --array=0-N%P line, %P included
        extra["array"] = arrays.spec(task_ids, res.get("array_parallelism"))
    params["additional_parameters"] = extra
    # a rank that dies takes the whole step down at once; otherwise its peers block in the next
    # collective until their NCCL/gloo timeout or the job's time limit.
    params["srun_args"] = ["--kill-on-bad-exit=1"]
    ours = afterstep_setup(res, run_dir, points=points, tasks=tasks) if run_dir is not None else []
    if res.get("container"):  # the ranks inside an image; this script stays on the host
        inside = spec.launch(res["container"], res["gpus_per_node"])
        params["srun_args"] += list(inside.srun_args)
        ours += list(inside.setup)
    if ours or setup:
        params["setup"] = ours + list(setup)
    return params


def afterstep_setup(res: Mapping[str, Any], run_dir: str, python: Optional[str] = None,
                    points: Optional[str] = None, tasks: Optional[str] = None) -> list:
    """Lines before srun: srun runs under hpc.afterstep (node failures, a node range after a requeue),
    which is told what the job asked for; the script outlives SIGTERM until srun has ended."""
    python = python or shlex.quote(sys.executable)
    limit = int(res.get("max_node_failures", defaults.MAX_NODE_FAILURES))
    where = f" --points {shlex.quote(points)}" * bool(points) + f" --tasks {shlex.quote(tasks)}" * bool(tasks)
    return ["trap true TERM  # hpc: a preemption, requeue or node failure: wait for srun under hpc.afterstep",
            f'srun() {{ {python} -u -m hpc.afterstep {shlex.quote(run_dir)}{where} -- "$@"; }}',
            f"export HPC_NODES={shlex.quote(str(res['nodes']))} HPC_MAX_NODE_FAILURES={limit}"
            + f" HPC_SIGNAL_DELAY_S={int(res.get('signal_delay_s') or 0)}" * bool(res.get("signal_delay_s"))
            + in_place(res),
            *node_check(res.get("node_check") or {})]


def in_place(res: Mapping[str, Any]) -> str:
    """The stage's restarts in place and spare nodes (hpc.recovery.inplace), where not the defaults."""
    restarts = int(res.get("max_restarts_in_place", defaults.MAX_RESTARTS_IN_PLACE))
    return (f" HPC_MAX_RESTARTS_IN_PLACE={restarts}" * (restarts != defaults.MAX_RESTARTS_IN_PLACE)
            + f" HPC_SPARE_NODES={int(res.get('spare_nodes') or 0)}" * bool(res.get("spare_nodes")))


def node_check(section: Mapping[str, Any]) -> list:
    """The stage's node check (hpc.recovery.nodecheck) for hpc.afterstep, as JSON in HPC_NODE_CHECK; [] when off."""
    if not (section.get("enabled") or section.get("command")):
        return []
    return [f"export HPC_NODE_CHECK={shlex.quote(json.dumps(dict(section), sort_keys=True))}"]


# hpc's events (hpc.rundir.notify.EVENTS) as SLURM's mail types; a hang has none of its own
MAIL_TYPES = {"task_failed": "FAIL", "requeued": "REQUEUE", "time_limit_cap": "TIME_LIMIT",
              "stage_completed": "END", "run_completed": "END"}
SLURM_MAIL_TYPES = ("NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT", "TIME_LIMIT",
                    "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS")


def with_mail(extra: Optional[Mapping[str, Any]], notify: Mapping[str, Any]) -> Dict[str, Any]:
    """A stage's sbatch options (stages.S.extra) with notify.mail as --mail-user and --mail-type (its
    mail_type, else its events' kinds: FAIL, REQUEUE, TIME_LIMIT, END); the stage's own mail options win."""
    extra = dict(extra or {})
    address = str(notify.get("mail") or "")
    if not address:
        return extra
    if not MAIL.fullmatch(address):
        raise ConfigError(f"notify.mail={address!r}; expected an address (user@site) or a user name. "
                          "HINT: notify.mail=me@example.org")
    kinds = [str(k).upper() for k in notify.get("mail_type") or []]
    kinds = kinds or list(dict.fromkeys(MAIL_TYPES[e] for e in notify.get("events") or MAIL_TYPES if e in MAIL_TYPES))
    bad = [k for k in kinds if k not in SLURM_MAIL_TYPES] or ([] if kinds else ["nothing"])
    if bad:
        said = f"mail_type={kinds}" if notify.get("mail_type") else f"events={list(notify.get('events') or [])}"
        raise ConfigError(f"notify.{said}: {bad[0]} for SLURM's mail (a hang has no mail type of its own); expected "
                          f"some of {list(SLURM_MAIL_TYPES)}. HINT: notify.mail_type=[END,FAIL]")
    ours = {"mail_user": address, "mail_type": ",".join(kinds)}
    theirs = {k.replace("-", "_") for k in extra}
    return {**{k: v for k, v in ours.items() if k not in theirs}, **extra}


def local_parameters(res: Mapping[str, Any]) -> Dict[str, Any]:
    """Parameters for submitit.LocalExecutor: one machine, CPU processes, no scheduler."""
    return {"timeout_min": res["time_min"], "tasks_per_node": res["local_tasks"], "nodes": 1,
            "gpus_per_node": 0, "signal_delay_s": res["signal_delay_s"]}


def submit_command(folder: str, python: Optional[str] = None) -> str:
    """The command submitit runs in each task (mirrors SlurmExecutor._submitit_command_str)."""
    python = python or shlex.quote(sys.executable)
    return " ".join([python, "-u -m submitit.core._submit", shlex.quote(folder)])


def render(params: Mapping[str, Any], folder: str, array_size: Optional[int] = None,
           python: Optional[str] = None) -> str:
    """The sbatch script submitit would write for these parameters."""
    from submitit.slurm.slurm import _make_sbatch_string  # private, but it is the source of truth

    params = dict(params)
    if array_size:
        params["map_count"] = array_size
    return _make_sbatch_string(command=submit_command(folder, python), folder=folder, **params)
