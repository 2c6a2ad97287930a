"""Which SLURM stop requeued a stage without hpc's loop (the time limit, a preemption, a node failure),
told to the run's sinks (hpc.rundir.notify) as `requeued`, with which.

    on_submitit_requeue(stage_dir, "first", job_id, restart)   # hpc.pipeline.executor, rank 0, at the start

hpc's loop and a `run` stage's wrapper read SLURM's verdict when they stop, and tell it. A stage
without either is stopped by SLURM or by submitit's own handler:
- at_signal(): submitit's handler caught the stop signal (--signal=USR2@delay: the time limit near;
  a site's PreemptParameters=send_user_signal sends it at a preemption too). `scontrol show job`
  names a preemption by its PreemptTime (hpc.recovery.verdict.classify); else the signal's timing
  says: the time-limit signal comes `delay` seconds before the job's EndTime (SLURM may send it up
  to a minute early, SLACK_S), a signal much earlier than that is not the time limit's. Without
  scontrol (a container) the job's end is the task's start plus the stage's time limit.
- previous(): a preemption that submitit does not handle (SIGTERM, GraceTime, SLURM's own requeue),
  or a node failure, is told by the next attempt once it starts: sacct's State of the attempt before
  it (PREEMPTED, NODE_FAIL, TIMEOUT, REQUEUED).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from hpc.recovery import verdict
from hpc.rundir import attempts, notify
from hpc.slurm import jobcontrol, scheduler

SLACK_S = 65  # SLURM sends the --signal up to 60 s before its time
UNSET = ("", "None", "Unknown", "(null)")  # scontrol's words for a time not set
ASK_S = 3.0  # scontrol's deadline in a signal handler: the checkpoint and the requeue need the grace time
# sacct's State of an attempt that was requeued -> (kind, in words)
STATES = {"PREEMPTED": ("preempt", "preempted"), "NODE_FAIL": ("node_fail", "its node failed"),
          "TIMEOUT": ("timeout", "it reached its time limit"),
          "REQUEUED": ("requeue", "requeued by scontrol requeue (not a preemption SLURM recorded)")}


def _epoch(text: str) -> Optional[float]:
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except (TypeError, ValueError):
        return None


def at_signal(job_id: str, limit_s: float, delay_s: float, started: float, now: Optional[float] = None,
              ask: Optional[Callable[..., Dict[str, str]]] = jobcontrol.job_info) -> Tuple[str, str]:
    """(kind, why) of the stop signal that submitit's handler caught in job `job_id`: 'timeout' or
    'preempt', or 'signal' where neither SLURM nor the time limit can say. `limit_s`: the stage's time
    limit, `delay_s`: its signal's delay, `started`: when this attempt's task started (epoch); `ask`:
    scontrol show job (None: no SLURM to ask, as under submitit's local executor)."""
    now = time.time() if now is None else now
    try:
        info = ask(job_id, deadline_s=ASK_S) if ask else {}
    except Exception:  # no scontrol here (a container), or SLURM does not answer: the timing decides
        info = {}
    end = _epoch(info.get("EndTime", "")) or (started + limit_s if limit_s > 0 else None)
    left = None if end is None else end - now
    timing = "signal" if left is None else "timeout" if left <= delay_s + SLACK_S else "preempt"
    kind = verdict.classify(info, timing, int(info.get("Restarts") or 0))[0] if info else timing
    if kind != timing or info.get("PreemptTime", "None") not in UNSET:  # SLURM's word: its PreemptTime, ...
        return kind, f"SLURM JobState={info.get('JobState')}, PreemptTime={info.get('PreemptTime')}"
    if kind == "preempt":
        return kind, (f"preempted: the signal came {left:.0f} s before the time limit, not the {delay_s:g} s "
                      "before it that the time limit's comes")
    if kind == "timeout":
        return kind, f"time limit near ({left:.0f} s left, the signal due {delay_s:g} s before it)"
    return kind, "time limit or preemption signal (SLURM did not say which)"


def previous(job_id: str, restart: int,
             history: Callable[[List[str]], Any] = scheduler.history) -> Tuple[str, str]:
    """(kind, why) of attempt `restart - 1` of job `job_id`, from sacct's record of each start."""
    try:
        rows = (history([job_id]) or {}).get(job_id) or []
    except Exception:  # no sacct here (a container, no accounting): said so
        rows = []
    if restart < 1 or len(rows) < restart:  # sacct's rows: one per start, oldest first
        return "requeue", "requeued by SLURM (no accounting here to say why)"
    state = (rows[restart - 1].get("State") or "?").split()[0]
    kind, words = STATES.get(state, ("requeue", f"requeued (SLURM State={state})"))
    return kind, f"attempt {restart - 1} {words} (SLURM State={state})"


def limits(cfg: Mapping[str, Any], stage: str) -> Tuple[float, float]:
    """(time limit, signal delay) of `stage` in seconds, from the run's config."""
    res = (cfg.get("stages") or {}).get(stage) or {}
    return float(res.get("time_min") or 0) * 60, float(res.get("signal_delay_s") or 0)


_task: Dict[str, Any] = {}  # the task this process runs, for the requeue that submitit's handler does


def on_submitit_requeue(task_dir: Path, task: str, job: str, restart: Any) -> None:
    """In a stage task's rank 0 of a run that names a sink, at its start. A requeue of its previous
    attempt that nothing told (SLURM's own, at a preemption or a node failure; no attempt record of
    hpc's loop or wrapper) is told now (previous()). When submitit's own handler of the stop signal
    requeues it (a stage whose stop flag takes that signal), the sinks hear `requeued`, once per
    attempt and timeout count, as the time limit or a preemption (at_signal(), asked before the
    requeue). Wraps the job environment's _requeue, which the handler calls once it checkpointed: a
    requeue that the host refuses raises there, and is not told."""
    executor = os.environ.get("SUBMITIT_EXECUTOR")
    run, cfg = attempts.run_of(task_dir)
    if executor not in ("slurm", "local") or run is None or not notify.settings(cfg):
        return  # the debug executor runs tasks in this process, and never requeues
    import submitit  # loaded already: this process is submitit's task

    # asked of SLURM as J_T in an array's task: the raw id of the task holding the array's record names all
    asked = jobcontrol.running_job() if executor == "slurm" else ""
    _task.update(task_dir=task_dir, task=task, job=job, asked=asked or str(job), restart=restart, started=time.time(),
                 limits=limits(cfg, task.partition("[")[0]), slurm=executor == "slurm")
    if int(restart or 0) > 0 and not _told(run, task_dir, f"{task}-{job}-{int(restart) - 1}"):
        kind, why = previous(asked or str(job), int(restart))
        notify.send(task_dir, "requeued", f"{task}-{job}-{int(restart) - 1}", f"{kind}: {why}", task)
    env = type(submitit.JobEnvironment())
    if getattr(env._requeue, "notifies", False):
        return
    requeue = env._requeue

    def told(self: Any, countdown: int) -> None:
        t = _task
        kind, why = at_signal(t["asked"], *t["limits"], t["started"], **({} if t["slurm"] else {"ask": None}))

        def tell() -> None:
            notify.send(t["task_dir"], "requeued", f"{t['task']}-{t['job']}-{t['restart']}-t{countdown}",
                        f"{kind}: submitit: {why}, requeued ({countdown} timeouts left)", t["task"])
        try:
            requeue(self, countdown)
        except SystemExit:  # the local executor's requeue: exit 144
            tell()
            raise
        tell()
    told.notifies = True  # type: ignore[attr-defined]
    env._requeue = told


def _told(run: Path, task_dir: Path, attempt: str) -> bool:
    """Whether the requeue of `attempt` ('task-job-restart') was told, or is its loop's or wrapper's to tell."""
    job, restart = attempt.rsplit("-", 2)[1:]
    if any(str(e.get("job")) == job and str(e.get("restart")) == restart for e in attempts.find(task_dir)):
        return True
    name, folder = f"requeued-{attempt}".replace("/", "_"), Path(run) / notify.FOLDER
    return folder.is_dir() and any(f == name or f.startswith(name + "-t") for f in os.listdir(folder))
