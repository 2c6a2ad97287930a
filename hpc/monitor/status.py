"""Where a run stands, per stage and task: the rows of `python -m hpc.status` (hpc.monitor.table draws them).

    python -c "from hpc.monitor import status; from hpc.rundir.run import RunDir; print(status.collect(RunDir('runs/x')))"

One scheduler call per poll (hpc.slurm.scheduler.query: sacct, or squeue where accounting is disabled),
whatever the number of jobs: a task that will never start, queued or ended unstarted by SLURM, is
recognised from the state of the job it waits for (the manifest records each job's afterok ids) in
that same answer. Without accounting, a
job that has left the queue has ended and its outcome is what it left behind: a done marker
(COMPLETED), submitit's result file (COMPLETED, or FAILED with the error), or nothing (ENDED, said
as such). Done markers, progress (tqdm's last redraw in the rank-0 stderr log, else the last line of
its stdout log), the world size and node count the task got (its done marker, else the latest start
line of its rank-0 log: under a node range it need not be the one requested), the task's outputs
and the newest hang its watchdog recorded (the stuck ranks and their hosts, hpc.recovery.hangs) come from the
run directory. Below the table: the run id, and whether the live code still matches the snapshot the
jobs import (hpc.rundir.snapshot: a stat of each file, a hash only where one changed).
A local or --cluster here task that left neither is RUNNING while its process or step runs
(hpc.monitor.alive), else UNKNOWN. A job whose sbatch answer was lost is found by its token
(hpc.monitor.lost: one squeue call more, only while such a submission is pending) and shown as
found so; a task a submission planned but never submitted (it stopped before that stage) is a row
of its own, UNSUBMITTED.
"""
from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from hpc.checkpoint import complete
from hpc.fs.sharedfs import listed
from hpc.monitor import goodput, lost
from hpc.monitor.alive import Alive
from hpc.monitor.logs import last_error, last_match, last_progress, packed, tqdm_progress
from hpc.recovery import hangs, nodefail
from hpc.rundir import attempts, logdirs
from hpc.rundir.run import DONE, RunDir, task_key
from hpc.rundir.sweepdir import is_sweep
from hpc.slurm import scheduler

# What a job left behind -> hpc state: for local/debug jobs (no scheduler), and for SLURM jobs that
# have left the queue of a cluster without accounting (then "none" reads ENDED: nothing to go by).
LEFT_BEHIND = {"done": "COMPLETED", "error": "FAILED", "result": "COMPLETED", "none": "UNKNOWN"}
ENDED = "ENDED"
UNSUBMITTED = "UNSUBMITTED"  # planned by a submission that stopped before submitting it
NOT_SUBMITTED = ("not submitted: the submission stopped before it. HINT: submit again with --run-dir RUN_DIR: "
                 "only the tasks neither done nor queued are submitted")
ENDED_WHY = ("ENDED (no accounting; no done marker, no result file): outcome unknown. "
             "HINT: python -m hpc.logs RUN_DIR --err")
# hpc.pipeline.executor's start line in each rank's stdout log: "[hpc] stage S item I rank 0/24 on 3 node(s) job ..."
STARTED = re.compile(rb"\[hpc\] stage .* rank [0-9]+/([0-9]+) on ([0-9]+) node\(s\)")


@dataclass
class TaskStatus:
    task: str
    stage: str
    item: Any
    job_id: str
    state: str
    restarts: int
    elapsed: str
    progress: str
    outputs: List[str]
    why: str
    error: str = ""  # last line of the rank-0 stderr log (the exception of a failed task)
    world_size: Optional[int] = None  # ranks the task got (None: not started, or nothing says)
    nodes: Optional[int] = None  # nodes it got
    hang: str = ""  # the newest hang the watchdog recorded: stuck ranks and hosts (hpc.recovery.hangs)
    recovery: str = ""  # node failures, excluded nodes and the latest decision (hpc.recovery.nodefail)
    set_aside: str = ""  # incomplete checkpoints of a user's script, set aside (hpc.scripts.resume)
    goodput: Optional[float] = None  # share of its attempts' time that trained and counts (hpc.monitor.goodput)
    software: str = ""  # the attempts that ran on other software than the one before (hpc.rundir.attempts)


def collect(run: RunDir, answer: Optional[Tuple[scheduler.Answer, Dict[str, Any]]] = None) -> List[TaskStatus]:
    """`answer`: query_run()'s, when one call asked for several runs (a sweep's points). The
    manifest is read once; each task costs a listing of its directory and one of its job's log
    folder (an array's tasks share one, listed once), and reads only the files those show (a done marker,
    a log, a hang report). A run with a pending announcement (hpc.monitor.lost) costs one squeue call
    more; an `answer` must then cover lost.look(run).run's jobs."""
    looked = lost.look(run)
    run = looked.run
    records, never = answer or query_run(run)
    in_sweep = functools.lru_cache(maxsize=None)(lambda: is_sweep(str(run.path.parent)))  # asked once, if ever
    folders: Dict[Path, Set[str]] = {}  # log folder -> its names: an array's tasks share one, listed once
    alive = Alive(run, in_sweep)  # a local or here task without an outcome: its process or step (hpc.monitor.alive)
    rows = [_row(run, t, records, in_sweep, folders, alive) for t in run.tasks()]
    rows += [_unsubmitted(run, stage, item) for stage, item in run.unsubmitted()]
    _explain(rows, records, never, run.job_tasks())
    said = lost.notes(looked)  # the jobs found by token, the sbatch calls whose answer was lost
    for r in rows:
        note = said.get(r.task)
        if note:
            r.why = note if r.state == UNSUBMITTED or not r.why else f"{note}; {r.why}"
    return rows


def _unsubmitted(run: RunDir, stage: str, item: Any) -> TaskStatus:
    """The row of a task no job was recorded for: COMPLETED by its done marker, else UNSUBMITTED."""
    here = listed(run.task_dir(stage, item))
    info = done_info(run, stage, item) if DONE in here else {}
    state = "COMPLETED" if DONE in here else UNSUBMITTED
    return TaskStatus(task_key(stage, item), stage, item, "-", state, 0, _elapsed(info), "", outputs(here),
                      "" if DONE in here else NOT_SUBMITTED, *_world(info, None))


def _row(run: RunDir, t: Dict[str, Any], records: scheduler.Answer, in_sweep: Callable[[], bool],
         folders: Dict[Path, Set[str]], alive: Alive) -> TaskStatus:
    jid, stage, item = t["job_id"], t["stage"], t["item"]
    rec = records.get(jid)
    task_dir = run.task_dir(stage, item)
    here, stage_logs = listed(task_dir), run.path / stage / "logs"
    if rec and rec.state == "PENDING" and not rec.restarts:  # not started: no logs yet
        logs, logged = stage_logs / jid, set()
    else:  # the stage's listing, and an array's folder, listed once for all its tasks
        logs = logdirs.folder(stage_logs, jid, _listed(stage_logs, folders))
        logged = _listed(logs, folders)
    if not logged and not (rec and rec.state == "PENDING") and in_sweep():  # a sweep's task that failed (or
        logs = logdirs.folder(run.path.parent / stage / "logs", jid)  # runs) before it linked its point's logs
        logged = _listed(logs, folders)
    info = done_info(run, stage, item) if DONE in here else {}
    result = logs / f"{jid}_0_result.pkl" if f"{jid}_0_result.pkl" in logged else None
    state = task_state(t, records, lambda: _left(DONE in here, result, lambda: alive.running(t)))
    tried = attempts.load(task_dir) if attempts.ATTEMPTS in here else []  # rank 0's records, if any
    own = packed(logged, jid, item, run.path.name if in_sweep() else None)  # a packed item's own log
    if own and DONE in here and state not in scheduler.ACTIVE:  # done in a packed job a sibling failed
        state = "COMPLETED"
    ranked = own or f"{jid}_0_log"
    out, err = (logs / f"{ranked}.{s}" if f"{ranked}.{s}" in logged else None for s in ("out", "err"))
    return TaskStatus(task_key(stage, item), stage, item, jid, state, rec.restarts if rec else 0,
                      rec.elapsed if rec else _elapsed(info),
                      (err and tqdm_progress(err)) or (out and last_progress(out)) or "",
                      outputs(here), "", (err and last_error(err)) or "", *_world(info, out),
                      hangs.summary(task_dir) if hangs.HANGS in here else "",
                      recovery=nodefail.summary(task_dir) if nodefail.HISTORY in here else "",
                      set_aside=complete.set_aside_summary(task_dir) if complete.SET_ASIDE in here else "",
                      goodput=goodput.share(tried, state, time.time()) if tried else None,
                      software=attempts.software_change(tried))


def task_state(t: Dict[str, Any], records: scheduler.Answer, left: Callable[[], str]) -> str:
    """A manifest task's state: its job's record, else PENDING (sacct may not list a job just
    submitted), else what its files tell (`left`: left_behind's answer), ENDED for a SLURM job."""
    rec, slurm = records.get(t["job_id"]), t["jobs"][-1]["executor"] == "slurm"
    if rec:
        return rec.state
    if slurm and records.source == "sacct":
        return "PENDING"
    state = left()  # a local job, or one that left the queue of a cluster without accounting
    return ENDED if slurm and state == LEFT_BEHIND["none"] else state


def query_run(*runs: RunDir) -> Tuple[scheduler.Answer, Dict[str, Optional[scheduler.JobRecord]]]:
    """One scheduler call for the SLURM jobs of the runs and the jobs they wait for: (records, the
    jobs that can never start, pending or ended unstarted by SLURM -> the upstream record that failed)."""
    after = {jid: deps for run in runs for jid, deps in run.dependencies().items()}
    ids = [jid for run in runs for jid in run.slurm_jobs()]
    records = scheduler.query(ids + [u for jid in ids for u in after.get(jid, [])])
    return records, {**scheduler.never_starts(records, after), **ended_unstarted(records, after)}


# Nodes of a job that never started: sacct's words, squeue's.
NO_NODES = frozenset({"", "None assigned"})


def ended_unstarted(records: scheduler.Answer, after: Dict[str, List[str]]) -> Dict[str, scheduler.JobRecord]:
    """Jobs SLURM ended unstarted because a job they wait on failed (sbatch --kill-on-invalid-dep,
    hpc.pipeline.sbatch) -> that job's record. They read CANCELLED, with the reason Dependency or
    none (sacct), so the upstream's state decides; one cancelled with its upstream stays CANCELLED."""
    out = {}
    for jid, rec in records.items():
        if rec.state == "CANCELLED" and rec.nodes in NO_NODES:
            failed = [records[u] for u in after.get(jid, ())
                      if u in records and records[u].state in ("FAILED", "TIMEOUT")]
            if failed:
                out[jid] = failed[0]
    return out


def done_info(run: RunDir, stage: str, item: Any) -> Dict[str, Any]:
    """A task's done marker ({} when there is none or it does not read)."""
    return run.done_info(stage, item) or {}


def _elapsed(info: Dict[str, Any]) -> str:
    """A finished task's run time from its done marker (no scheduler to ask), as sacct writes it."""
    try:
        seconds = int(info["finished"] - info["started"])
    except (KeyError, TypeError):
        return ""
    return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def world(run: RunDir, stage: str, item: Any, job_id: str) -> Tuple[Optional[int], Optional[int]]:
    """(world size, nodes) a task got: its done marker's, else those of the latest start line in its
    rank-0 log (a requeued job appends one per start, and under a node range each may differ)."""
    return _world(done_info(run, stage, item), run.log_path(stage, job_id))


def _listed(folder: Path, folders: Dict[Path, Set[str]]) -> Set[str]:
    if folder not in folders:
        folders[folder] = listed(folder)
    return folders[folder]


def _world(info: Dict[str, Any], log: Optional[Path]) -> Tuple[Optional[int], Optional[int]]:
    if isinstance(info.get("world_size"), int):
        return info["world_size"], info.get("nodes") if isinstance(info.get("nodes"), int) else None
    found = last_match(log, STARTED) if log else None
    return (int(found[1]), int(found[2])) if found else (None, None)


def left_behind(run: RunDir, stage: str, item: Any, job_id: str, running: Optional[Callable[[], bool]] = None,
                in_sweep: bool = False) -> str:
    """The state an ended job's files tell: its done marker, else rank 0's submitit result file, for
    a sweep's point (`in_sweep`) in the sweep's folder where its task failed before linking its logs
    (hpc.rundir.sweepdir); `running`: as _left's."""
    roots = (run.path, run.path.parent) if in_sweep else (run.path,)
    results = (logdirs.folder(root / stage / "logs", job_id) / f"{job_id}_0_result.pkl" for root in roots)
    return _left(run.is_done(stage, item), next((r for r in results if r.exists()), None), running)


def _left(done: bool, result: Optional[Path], running: Optional[Callable[[], bool]] = None) -> str:
    """`running`: whether the task runs, asked only of one that left nothing (RUNNING, else UNKNOWN)."""
    if done:
        return LEFT_BEHIND["done"]
    if result is None:
        return "RUNNING" if running is not None and running() else LEFT_BEHIND["none"]
    import pickle

    outcome = pickle.loads(result.read_bytes())[0]  # ("success" | "error", payload), written by submitit
    return LEFT_BEHIND["result" if outcome == "success" else "error"]


def _explain(rows: List[TaskStatus], records: Dict[str, scheduler.JobRecord],
             never: Dict[str, Optional[scheduler.JobRecord]], job_tasks: Dict[str, str]) -> None:
    """Fill in `why`: the reason a task waits, will never run, or failed."""
    for r in rows:
        rec = records.get(r.job_id)
        if r.job_id in never:
            upstream = never[r.job_id]
            cause = (f"waits on {_name(upstream.job_id, job_tasks)} which "
                     f"{upstream.state} (afterok)" if upstream else f"SLURM reports {scheduler.NEVER}")
            queued = rec is None or rec.state == "PENDING"  # else SLURM has ended it unstarted
            r.state = "NEVER"
            r.why = (f"never: {cause}" + ("" if queued else ", so SLURM ended it unstarted") + ". HINT: fix it and "
                     "resubmit with --run-dir" + (", or python -m hpc.cancel RUN_DIR" if queued else ""))
        elif rec and rec.state == "PENDING" and rec.reason not in ("", "None"):
            r.why = rec.reason
        elif r.state == "TIMEOUT":
            reason = rec.reason if rec and rec.reason not in ("", "None") else "TimeLimit"
            r.why = (f"TIMEOUT ({reason}): killed at its time limit. HINT: raise stages.{r.stage}.time_min, "
                     "or resubmit with --run-dir to continue from the last checkpoint")
        elif r.state == ENDED:
            r.why = ENDED_WHY
        elif r.state == "FAILED":
            code = f"exit code {rec.exit_code}: " if rec and rec.exit_code else ""
            r.why = f"{code}{r.error or '?'} (python -m hpc.logs RUN_DIR --stage {r.stage} --err)"


def _name(job_id: str, job_tasks: Dict[str, str]) -> str:
    return f"stage {job_tasks[job_id]}" if job_id in job_tasks else f"job {job_id}"


def outputs(names: Set[str]) -> List[str]:
    skip = {"logs", DONE, nodefail.HISTORY, attempts.ATTEMPTS}
    return sorted(n for n in names if n not in skip and not n.startswith("task-"))
