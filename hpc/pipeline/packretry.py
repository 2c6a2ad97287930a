"""A packed item whose step failed, started again in the same job where a restart in place is allowed.

    python -m hpc.pipeline.packrun RUN_DIR -- srun ...   # the pack's driver asks offer() for a failed item

An unpacked job's srun wrapper starts a new srun step in the same allocation after a rank failed
(hpc.afterstep, hpc.recovery.restart); a packed job's driver does the same for one item: its step alone
is started again, its siblings' steps untouched, and its ranks resume from its own newest checkpoint.
hpc.recovery.inplace.decide rules on the item's own history (its task's recovery.json): at most
stages.X.max_restarts_in_place per job attempt, never for the same failure at the same step as the
last restart (no newer checkpoint: a deterministic error is restarted once, then left failed), never
when the job's time left is below what a restart takes; and never while SLURM is ending the job (a
preemption, the time limit, scancel), which is the stop's business (hpc.pipeline.packstop). A
restart is recorded in the item's history as the wrapper's are, which python -m hpc.status shows.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Mapping, Tuple

ENDING = "SLURM is ending the job"  # offer's answer at a stop: the same for every item, asked of SLURM once


def offer(task_dir: Path, key: str, environ: Mapping[str, str], started: float, request: str) -> Tuple[bool, str]:
    """(restart item's step in place?, why) after it failed; the restart recorded where it is one.
    `key`: the item's job as SLURM names it (J or J_T), `started`: when its step started (Unix time),
    `request`: its ranks' stop request file (a failing rank's error waits in its folder)."""
    # here, not at the top: only a failed item needs them
    from hpc.recovery import deadline, inplace, nodefail, preemption, restart
    from hpc.rundir import notify

    info = preemption.job_info(key, tries=1)
    state = info.get("JobState", "").split("+")[0]
    if state != "RUNNING" or nodefail.preempted(info):
        preempted = f", PreemptTime={info.get('PreemptTime')}" if nodefail.preempted(info) else ""
        return False, f"{ENDING} (JobState={state or '?'}{preempted})"
    attempt = int(environ.get("SLURM_RESTART_COUNT") or 0)
    history = nodefail.load(task_dir)
    before = [e for e in history.get("events", []) if e.get("kind") == inplace.KIND
              and (e.get("job"), e.get("restart")) == (key, attempt)]
    mark = nodefail.progress_mark(task_dir)
    kind = "error" if notify.a_rank_failed(os.path.dirname(request)) else "crash"
    now, end = time.time(), deadline.end_time(info)
    cost = restart.measured({"started": started}, task_dir, now)
    ok, why = inplace.decide(inplace.Failure(kind, mark, mark), before, inplace.limit(environ),
                             None if end is None else end - now, cost, inplace.warned(environ))
    if ok:
        restart.record(task_dir, history, {
            "time": now, "job": key, "restart": attempt, "kind": inplace.KIND, "failure": kind, "step": mark,
            "progress": mark, "in_place": len(before) + 1, "failed_nodes": [], "nodes": [], "cost_s": round(cost, 1),
            "left_s": None if end is None else round(end - now), "do": "restart", "why": why,
            "done": f"its step started again in job {key}, its siblings' left running"})
    return ok, why
