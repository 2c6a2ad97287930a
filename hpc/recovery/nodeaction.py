"""What the srun wrapper (python -m hpc.afterstep) does once srun has failed or SIGTERM has come.

    python -m hpc.afterstep RUN_DIR -- srun ARGS...     # in hpc's batch scripts; it calls after_step

Read SLURM (the job, the states of its nodes), decide (hpc.recovery.nodefail.decide: was it a node
or the code, is another attempt worth it), carry it out (requeue with the failed nodes excluded,
give a node range back, or stop), and record it in the task's history, which hpc.status shows.
settle_request() carries out a rank's stop request (hpc.recovery.hostact) the same way: ranks never
call SLURM under the wrapper, which runs on the host (inside a container there is no scontrol).
Where SLURM refuses the requeue, a job of the caller's (`resubmit_after`) submits the stage again
into the run directory once this one has ended: the submission itself belongs to the layers above.
"""
from __future__ import annotations

import json
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from hpc.fs import atomic
from hpc.recovery import hostact, nodefail, preemption, requeue
from hpc.rundir import sweepdir
from hpc.rundir.run import RunDir
from hpc.slurm import scheduler

# (job id, run dir, stage, nodes to exclude, scontrol's fields of the job) -> the new job's id
Resubmit = Callable[[str, str, str, Sequence[str], Mapping[str, str]], str]


def after_step(run: RunDir, env: Mapping[str, str], resubmit_after: Resubmit, srun_ended: bool = True,
               points: Optional[str] = None) -> tuple:
    """Read SLURM, decide (hpc.recovery.nodefail.decide), carry it out, record it: (action, in words).
    `points`: a sweep array's file naming each task's point (hpc.rundir.sweepdir.run_for).
    `resubmit_after(job_id, run_dir, stage, exclude, info)` submits the job that submits the stage
    again once this one has ended, where SLURM refuses the requeue; it returns that job's id."""
    job_id = env["SLURM_JOB_ID"]
    stop = hostact.request_path(str(run.path), job_id, env.get("SLURM_RESTART_COUNT") or "0")  # as hpc.afterstep
    array_task = env.get("SLURM_ARRAY_TASK_ID")
    key = f"{env['SLURM_ARRAY_JOB_ID']}_{array_task}" if array_task else job_id  # as the manifest has it
    run = sweepdir.run_for(run.path, key, points)  # a sweep's array task: the run directory of its point
    restart = int(env.get("SLURM_RESTART_COUNT") or 0)
    info = preemption.job_info(job_id)
    failed = nodefail.failed_nodes(scheduler.node_states(env["SLURM_JOB_NODELIST"]))
    task = next((t for t in run.tasks() if any(j["job_id"] == key for j in t["jobs"])), None)
    stage = task["stage"] if task else env.get("SLURM_JOB_NAME", "?")
    task_dir = run.task_dir(stage, task["item"]) if task else None
    history = nodefail.load(task_dir) if task_dir else {}
    mark = nodefail.progress_mark(task_dir) if task_dir else None
    already = nodefail.requeued(info, restart)
    action = nodefail.decide(history, failed, already, mark, nodefail.env_limit(env), stage,
                             preempted=srun_ended and nodefail.preempted(info))
    done = carry_out(action, job_id, info, already, restart, str(run.path), stage, env, resubmit_after)
    if task_dir and action.do != "none":
        nodefail.record(task_dir, history, action, key, restart, failed, mark, done)
    if action.do != "none":
        note_next(stop, done)
    return action, f"{action.why}: {done}"


def carry_out(action: nodefail.Action, job_id: str, info: Dict[str, str], already: bool, restart: int,
              run_dir: str, stage: str, env: Mapping[str, str], resubmit_after: Resubmit) -> str:
    if action.do == "none":
        return "left as it is"
    if action.do == "reopen":
        return _said(requeue.after_requeue(job_id, (), env), "requeued")
    if action.do == "stop":
        if already:  # SLURM requeued it for the node failure on its own: take that back
            scheduler.cancel([job_id])
            return f"stopped; SLURM's requeue of job {job_id} cancelled"
        return "stopped"
    exclude = sorted(set(requeue.excluded(info)) | set(action.exclude))
    if not already:  # asked again while the controller does not answer, until the job's EndTime is near
        seen = requeue.until_queued(lambda run, left: scheduler.requeue(job_id, runner=run, deadline_s=left),
                                    lambda: nodefail.requeued(preemption.job_info(job_id, tries=1), restart),
                                    requeue.within_grace(info), subprocess.run)
        if seen:  # refused, or no answer in time, and SLURM has not requeued it meanwhile
            new = resubmit_after(job_id, run_dir, stage, exclude, info)
            without = f", excluding {','.join(exclude)}" if exclude else ""
            return (f"requeue refused ({seen}); job {new} submits the task again into the run "
                    f"directory once job {job_id} has ended{without}")
    return _said(requeue.after_requeue(job_id, exclude, env), f"requeued as job {job_id}")


def note_next(request: str, done: str) -> None:
    """Where this attempt's stop was not requeued (its rank's request, settled: `request`.done), its
    record (the history the request named, checkpoints/requeue.json) says what happened next: `done`,
    the requeue or the resubmission carried out once srun had ended."""
    record = hostact.pending(request + ".done") or {}
    if record.get("history") and (record.get("outcome") or {}).get("requeue") is False:
        history = preemption.load_history(Path(record["history"]))
        if history.get("events"):
            history["events"][-1]["next"] = done
            atomic.write_text(Path(record["history"]), json.dumps(history, indent=1))


def _said(values: Dict[str, str], what: str) -> str:
    return f"{what} with {' '.join(f'{k}={v}' for k, v in values.items())}" if values else what


def settle_request(path: str, runner: Callable[..., Any] = subprocess.run) -> str:
    """Rank 0's stop request at `path` (hpc.recovery.hostact) carried out here, on the host: SLURM
    read, the decision recorded in the task's history, the job requeued (preemption.settle; `runner`
    runs its SLURM clients)."""
    request = hostact.pending(path)
    if request is None:
        return f"no stop request at {path}"
    try:
        if request["reason"] == hostact.SUBMITIT:  # submitit counted the timeouts and checkpointed: requeue only
            refused, said = preemption.requeue_job(str(request["job_id"]), int(request["restart"]), True, runner,
                                                   requeue.within_grace(preemption.job_info(str(request["job_id"]))))
            outcome = {"requeue": not refused, "why": refused or "submitit's checkpoint at the time limit",
                       "slurm": said}
        else:
            outcome = asdict(preemption.settle(request["reason"], request["history"], str(request["job_id"]),
                                               int(request["restart"]), int(request["max_timeouts"]), runner))
    except Exception as err:
        hostact.done(path, {"error": f"{type(err).__name__}: {err}"})
        raise
    hostact.done(path, outcome)
    return f"the ranks stopped ({request['reason']}): {outcome['why']}" + (" (requeued)" if outcome["requeue"] else "")
