"""One job through scontrol and scancel: read it, requeue it, lift its hold, update it, cancel it.

Polling the states of many jobs at once (sacct, squeue) is hpc.slurm.scheduler's. Each call here is one
SLURM client run (hpc.slurm.cli.run): a refusal raises SlurmExit with SLURM's words, a SLURM that
cannot be asked raises RuntimeError. `env` is the environment the client runs in (default: this
process's), so a caller can act on another cluster than the one its shell points at. A busy
controller is asked again (hpc.slurm.cli.run) until `deadline_s` (default HPC_SLURM_RETRY_S, 60 s): a
caller bounded by a grace time passes what it has left.
"""
from __future__ import annotations

import os
import re
import subprocess
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional

from hpc.slurm.cli import SlurmExit, run


def running_job(environ: Mapping[str, str] = os.environ) -> str:
    """The job this process runs in, as the scheduler must be told it: J_T in task T of array J, else
    SLURM_JOB_ID ('' outside SLURM). One task of an array (the one holding the array's own record, often
    the last to start) has SLURM_JOB_ID == SLURM_ARRAY_JOB_ID, and `scontrol requeue J` or `show job J`
    then acts on, or answers for, every task of the array."""
    array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else environ.get("SLURM_JOB_ID", "")


def job_info(job_id: str, env: Optional[Mapping[str, str]] = None, timeout_s: float = 30,
             runner: Callable[..., Any] = subprocess.run, deadline_s: Optional[float] = None) -> Dict[str, str]:
    """`scontrol -o show job JOBID` as a dict (JobState, Reason, Restarts, PreemptTime, ...): hpc's one
    parser of it. Raises SlurmExit, with SLURM's words, if the job is unknown; RuntimeError if SLURM
    cannot be asked. `runner` runs the command (subprocess.run's arguments). An array's id answers
    one line per task: the record is the line of the job asked for (JobId, or ArrayJobId_ArrayTaskId)."""
    out = run(["scontrol", "-o", "show", "job", str(job_id)], env, timeout_s, runner, deadline_s)
    rows = [dict(tok.split("=", 1) for tok in line.split() if "=" in tok) for line in out.splitlines() if line.strip()]
    named = [r for r in rows if str(job_id) in (r.get("JobId"), f"{r.get('ArrayJobId')}_{r.get('ArrayTaskId')}")]
    return (named or rows or [{}])[0]


def requeue(job_id: str, env: Optional[Mapping[str, str]] = None,
            runner: Callable[..., Any] = subprocess.run, deadline_s: Optional[float] = None) -> None:
    """Put the job back in the queue; SLURM then holds it back for a while (start_now lifts that)."""
    run(["scontrol", "requeue", str(job_id)], env, runner=runner, deadline_s=deadline_s)


def start_now(job_id: str, env: Optional[Mapping[str, str]] = None, deadline_s: Optional[float] = None) -> None:
    """Lift a requeued job's begin-time hold (SLURM holds it back about two minutes)."""
    update_job(job_id, {"StartTime": "now"}, env, deadline_s)


def update_job(job_id: str, fields: Mapping[str, str], env: Optional[Mapping[str, str]] = None,
               deadline_s: Optional[float] = None) -> None:
    """`scontrol update JobId=J KEY=VALUE ...` (StartTime, NumTasks, ExcNodeList, ...)."""
    run(["scontrol", "update", f"JobId={job_id}", *(f"{k}={v}" for k, v in fields.items())], env,
        deadline_s=deadline_s)


def node_states(nodes: str, env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """Node -> State (IDLE, MIXED+NOT_RESPONDING, DOWN, ...) of a hostlist ("n[1-2]"): one scontrol call."""
    rows = [dict(t.split("=", 1) for t in line.split() if "=" in t)
            for line in run(["scontrol", "-o", "show", "node", nodes], env).splitlines()]
    return {r["NodeName"]: r.get("State", "") for r in rows if "NodeName" in r}


# scancel's words for a job that is ending or gone: after a retry, the first call's work (its answer was lost)
ENDED = re.compile(r"error: Kill job error on job id (\S+): (Job/step already completing or completed|"
                   r"Invalid job id specified)$")


def cancel(job_ids: Iterable[str], env: Optional[Mapping[str, str]] = None,
           runner: Callable[..., Any] = subprocess.run) -> List[str]:
    """Cancel the jobs with one scancel call (none for no ids); returns their ids, sorted. A call asked
    again (hpc.slurm.cli.run: the first answer was lost, not the request) that SLURM answers with "already
    completing or completed" or "Invalid job id specified" for the ids asked, and nothing else, is done."""
    ids = sorted(set(job_ids))
    if not ids:
        return ids
    answers: List[Any] = []

    def kept(*args: Any, **kwargs: Any) -> Any:
        answers.append(None)  # a try that gives no answer (its timeout) stays None
        answers[-1] = runner(*args, **kwargs)
        return answers[-1]

    try:
        run(["scancel", *ids], env, runner=kept)
    except SlurmExit:
        said = (answers[-1].stderr or "").strip().splitlines() if len(answers) > 1 and answers[-1] else []
        if not said or not all((m := ENDED.search(line.strip())) and m.group(1) in ids for line in said):
            raise
    return ids
