"""The status table of a run: its rows in the order that needs a look first, drawn, and redrawn
while the run changes (`python -m hpc.status RUN_DIR`, `python -m hpc.submit ... --wait`).

    python -c "from hpc.monitor import status, table; from hpc.rundir.run import RunDir; print(table.format_table(status.collect(RunDir('runs/x'))))"

The rows are hpc.monitor.status's (one TaskStatus per task, one scheduler call per poll).
"""
from __future__ import annotations

import collections
import sys
import time
from typing import List, Optional

from hpc.monitor import lost
from hpc.monitor.status import TaskStatus, collect, query_run
from hpc.rundir.run import RunDir
from hpc.slurm import scheduler

# The table's order: what needs a look (failed, then running), then what waits, then what is done.
ORDER = ("NEVER", "FAILED", "TIMEOUT", "CANCELLED", "RUNNING", "PREEMPTED", "ENDED", "UNKNOWN", "UNSUBMITTED",
         "PENDING", "COMPLETED")


def by_state(states: List[str], what: str = "task") -> str:
    """'10000 task(s): 12 FAILED, 950 RUNNING, 9038 COMPLETED', in ORDER."""
    counts = collections.Counter(states)
    return f"{len(states)} {what}(s): " + ", ".join(f"{counts[s]} {s}" for s in sorted(counts, key=rank))


def rank(state: str) -> int:
    return ORDER.index(state) if state in ORDER else len(ORDER) - 1


def format_table(rows: List[TaskStatus]) -> str:
    """One row per task, failed and running ones first (in the run's order within a state)."""
    head = ("TASK", "JOB", "STATE", "RESTARTS", "ELAPSED", "WORLD", "NODES", "PROGRESS / WHY")
    rows = sorted(rows, key=lambda r: rank(r.state))
    body = [(r.task, r.job_id, r.state, str(r.restarts), r.elapsed, _count(r.world_size), _count(r.nodes),
             r.why or r.progress) for r in rows]
    if any(r.goodput is not None for r in rows):  # a task with attempt records: hpc.monitor.goodput's share
        head = (*head[:7], "GOODPUT", head[7])
        body = [(*b[:7], "-" if r.goodput is None else f"{r.goodput:.0%}", b[7]) for r, b in zip(rows, body)]
    widths = [max(len(x) for x in col) for col in zip(head, *body)] if body else [len(h) for h in head]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head, *body]]
    lines += [f"  {r.task} outputs: {', '.join(r.outputs)}" for r in rows if r.outputs]
    lines += [f"  {r.task} hang: {r.hang}" for r in rows if r.hang]
    lines += [f"  {r.task} node failures: {r.recovery}" for r in rows if r.recovery]
    lines += [f"  {r.task} checkpoints: {r.set_aside}" for r in rows if r.set_aside]
    lines += [f"  {r.task} software: {r.software}" for r in rows if r.software]
    return "\n".join(lines)


def _count(value: Optional[int]) -> str:
    return "-" if value is None else str(value)


def follow(run: RunDir, interval_s: float = 5.0, out=None) -> int:
    """Print the table whenever it changes until nothing is active; non-zero if anything failed."""
    out = out or sys.stdout
    last = None
    while True:
        pinned = lost.look(run).run  # with the jobs found by token, which the one query then covers
        records, never = answer = query_run(pinned)
        rows = collect(pinned, answer)
        seen = [(r.task, r.state, r.why or r.progress) for r in rows]  # not elapsed: it always moves
        if seen != last:
            print(time.strftime("%H:%M:%S"), file=out)
            print(format_table(rows), file=out, flush=True)
            last = seen
        if not any(r.state in scheduler.ACTIVE for r in rows):
            orphans = [jid for jid in never if records[jid].state == "PENDING"]
            if orphans:  # they would pend forever: cancel them, a resubmission replaces them
                print(f"cancelling jobs that can never start: {' '.join(scheduler.cancel(orphans))}", file=out)
            return 0 if rows and all(r.state == "COMPLETED" for r in rows) else 1
        time.sleep(interval_s)
