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
import os
import subprocess
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from hpc.fs import atomic
from hpc.recovery import hangs, hostact, nodefail, preemption, requeue, verdict
from hpc.recovery import restart as restart_module
from hpc.rundir import notify, sweepdir
from hpc.rundir.run import DONE, RunDir
from hpc.slurm import scheduler

# (job id, run dir, stage, nodes to exclude, scontrol's fields of the job) -> the new job's id
Resubmit = Callable[[str, str, str, Sequence[str], Mapping[str, str]], str]


def located(run: RunDir, env: Mapping[str, str], points: Optional[str] = None) -> tuple:
    """(run, key, stage, task dir or None) of the task this job runs: `key` its id as the manifest has
    it; `points`: a sweep array's file naming each task's point (hpc.rundir.sweepdir.run_for)."""
    key = scheduler.running_job(env)
    run = sweepdir.run_for(run.path, key, points)  # a sweep's array task: the run directory of its point
    task = next((t for t in run.tasks() if any(j["job_id"] == key for j in t["jobs"])), None)
    stage = task["stage"] if task else env.get("SLURM_JOB_NAME", "?")
    return run, key, stage, run.task_dir(stage, task["item"]) if task else None


def after_step(run: RunDir, env: Mapping[str, str], resubmit_after: Resubmit, srun_ended: bool = True,
               points: Optional[str] = None, state: Optional[Dict[str, Any]] = None) -> tuple:
    """Read SLURM, decide (a restart in place, hpc.recovery.restart; else hpc.recovery.nodefail.decide),
    carry it out, record it: (action, in words). `points`: see located(). `state`: the srun wrapper's
    steps (hpc.recovery.restart), None where nothing restarts in place.
    `resubmit_after(job_id, run_dir, stage, exclude, info)` submits the job that submits the stage
    again once this one has ended, where SLURM refuses the requeue; it returns that job's id."""
    job_id = scheduler.running_job(env)  # what scontrol is told: J_T in an array, never the array's J
    stop = (state or {}).get("request") or hostact.request_path(str(run.path), env["SLURM_JOB_ID"],
                                                                 env.get("SLURM_RESTART_COUNT") or "0")
    run, key, stage, task_dir = located(run, env, points)
    restart = int(env.get("SLURM_RESTART_COUNT") or 0)
    info = preemption.job_info(job_id)
    if state is not None and srun_ended and task_dir is not None and (task_dir / DONE).is_file() \
            and not nodefail.preempted(info):  # preempted, it would end TIMEOUT: requeued, its rerun ends at once
        # its rank 0 wrote the done marker: the work is whole (a rank that died at exit, after training)
        state["finished"] = True
        return nodefail.Action("none", "finished"), ("the task had finished its work (its done marker is "
                                                     "written): nothing is run again, and the job ends completed")
    failed = nodefail.failed_nodes(scheduler.node_states(env["SLURM_JOB_NODELIST"]))
    history = nodefail.load(task_dir) if task_dir else {}
    mark = nodefail.progress_mark(task_dir) if task_dir else None
    already = nodefail.requeued(info, restart)
    instead = declined = ""
    if state is not None and srun_ended and not already and not nodefail.preempted(info):
        restarted, why = restart_module.offer(state, task_dir, history, failed, info, env, key)
        if restarted:
            return nodefail.Action("restart", why), why
        declined, instead = why, f" (not restarted in place: {why})"
    action = nodefail.decide(history, failed, already, mark, nodefail.env_limit(env), stage,
                             preempted=srun_ended and nodefail.preempted(info))
    if action.do in ("requeue", "reopen"):  # the run's avoid list (hpc.recovery.nodecheck), on every requeue
        action = replace(action, exclude=tuple(sorted(set(action.exclude) | set(avoided(state)))))
    done = carry_out(action, job_id, info, already, restart, str(run.path), stage, env, resubmit_after)
    if task_dir and action.do != "none":
        nodefail.record(task_dir, history, action, key, restart, failed, mark, done)
    if action.do != "none":
        note_next(stop, done)
    if action.do == "none" and declined:  # a failed step neither restarted nor requeued: one line, its error
        error = restart_module.held_error(state or {})
        return action, f"not restarted in place: {declined}; the job ends failed" + f": {error}" * bool(error)
    return action, f"{action.why}: {done}{instead}"


def carry_out(action: nodefail.Action, job_id: str, info: Dict[str, str], already: bool, restart: int,
              run_dir: str, stage: str, env: Mapping[str, str], resubmit_after: Resubmit) -> str:
    if action.do == "none":
        return "left as it is"
    if action.do == "reopen":
        return _said(requeue.after_requeue(job_id, requeue.adding(info, action.exclude), env), "requeued")
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


def avoided(state: Optional[Mapping[str, Any]]) -> list:
    """The run's avoid list where the srun wrapper's stage checks its nodes (its state's 'avoid',
    hpc.recovery.nodecheck.avoided), else []: every requeue of the job adds it to ExcNodeList."""
    return list(state["avoid"]()) if state and state.get("avoid") else []


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


def settle_request(path: str, runner: Callable[..., Any] = subprocess.run,
                   state: Optional[Dict[str, Any]] = None) -> str:
    """Rank 0's stop request at `path` (hpc.recovery.hostact) carried out here, on the host: SLURM
    read, the decision recorded in the task's history, the job requeued (preemption.settle; `runner`
    runs its SLURM clients); a hang restarted in place instead where `state` (the srun wrapper's steps,
    hpc.recovery.restart) allows it (in_place)."""
    request = hostact.pending(path)
    if request is None:
        return f"no stop request at {path}"
    try:
        outcome = in_place(request, state) if request["reason"] in ("hang", "preempt") and state else None
        if outcome is None and request["reason"] == hostact.SUBMITIT:  # submitit checkpointed: requeue only
            info = preemption.job_info(str(request["job_id"]))
            refused, said = preemption.requeue_job(str(request["job_id"]), int(request["restart"]), True, runner,
                                                   requeue.within_grace(info), requeue.adding(info, avoided(state)))
            outcome = {"requeue": not refused, "why": refused or "submitit's checkpoint at the time limit",
                       "slurm": said}
        elif outcome is None:
            outcome = asdict(preemption.settle(request["reason"], request["history"], str(request["job_id"]),
                                               int(request["restart"]), int(request["max_timeouts"]), runner,
                                               avoided(state)))
    except Exception as err:
        hostact.done(path, {"error": f"{type(err).__name__}: {err}"})
        raise
    hostact.done(path, outcome)
    instead = f" (not restarted in place: {state.pop('declined')})" if state and "declined" in state else ""
    return (f"the ranks stopped ({request['reason']}): {outcome['why']}" + (" (requeued)" if outcome["requeue"] else "")
            + instead)


def in_place(request: Mapping[str, Any], state: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """A hang restarted in place (hpc.recovery.restart.offer_hang): the host's answer, with the hang
    counted in the stop record as a requeue's is (max_hangs); None where it falls back to a requeue.
    A `run` script's runner asks the same for a SIGTERM: where SLURM shows no stop of the job, it is
    srun ending the step after a rank failed (--kill-on-bad-exit), which restart.offer looks at next."""
    env = {"SLURM_JOB_ID": str(request["job_id"]), **state.get("env", {})}  # the raw id names its folders
    info = preemption.job_info(str(request["job_id"]))
    if request["reason"] != "hang":  # a SIGTERM: SLURM's stop of the job, srun ending the step (a rank died), or yours
        ended = nodefail.preempted(info) or info.get("JobState", "").split("+")[0] != "RUNNING" \
            or nodefail.requeued(info, int(request["restart"]))
        # srun ends the step once a rank has failed, and that rank wrote its error into the step's folder
        # before it exited (hpc.rundir.notify.failed); without one, the SIGTERM came from outside
        # (`scancel --signal=TERM`): a stop, requeued as a preemption's
        if ended or not notify.a_rank_failed(os.path.dirname(state.get("request") or "")):
            return None
        return {"requeue": False, "by": hangs.IN_PLACE, "kind": "preempt", "why": (
            "SIGTERM while SLURM shows the job running, not preempted, after a rank failed: srun is ending "
            "the step; the step is looked at once srun has ended")}
    _, key, _, task_dir = located(RunDir(state["run_dir"]), env, state.get("points"))
    history = nodefail.load(task_dir) if task_dir else {}
    restarted, why = restart_module.offer_hang(state, task_dir, history, info, env, key)
    if not restarted:
        state["declined"] = why
        return None
    decision = verdict.Decision(False, hangs.IN_PLACE, why, "hang")
    preemption.record(Path(request["history"]), preemption.load_history(Path(request["history"])), decision, info,
                      slurm="nothing asked of SLURM: a new srun step in the same allocation")
    return asdict(decision)
