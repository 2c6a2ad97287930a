"""Where a sweep stands, one row per point: its state, its tasks done, its latest metrics.

    python -m hpc.status runs/sweep-20260101-120000      # a sweep directory: this table

One scheduler call for every point's jobs (hpc.monitor.status.query_run); the points come from the
sweep's record (hpc.rundir.sweepdir). A sweep sbatch call whose answer was lost (an announcement left
in the sweep directory) costs one squeue call more, for all points: the job found by its token is
shown in its points, as hpc.status shows it in a run (hpc.monitor.lost).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List

from hpc.monitor import lost, status, table
from hpc.monitor.alive import Alive
from hpc.rundir.sweepdir import SweepDir, describe
from hpc.slurm import scheduler

# A point's state from its tasks' states: the first row that any task is in wins (a table, not branches).
# It is what the table shows, not whether the point is over: a failed task ranks above a running one,
# so a waiter asks `active` (tasks queued or running), never the state.
PRECEDENCE = ("NEVER", "FAILED", "TIMEOUT", "CANCELLED", "ENDED", "UNKNOWN", "RUNNING", "PREEMPTED", "PENDING")
NOT_SUBMITTED = "NOT SUBMITTED"


@dataclass
class PointStatus:
    point: str  # signature, the point's directory name
    overrides: Dict[str, Any]
    in_grid: bool
    state: str
    tasks: str  # "done/total"
    metric: str  # the latest metrics.json: "stage[item] key=value ..."
    run_dir: str
    active: int = 0  # its tasks still queued or running (scheduler.ACTIVE): the sweep is over at 0 for all
    note: str = ""  # its jobs found by token, its sbatch calls whose answer was lost (hpc.monitor.lost.notes)


def collect(sweep: SweepDir) -> List[PointStatus]:
    """One row per point, from one scheduler call for all points' jobs. Each point's manifest is
    read once, and a task costs a look-up in that answer (its files only when SLURM has no record)."""
    points = sweep.record()["points"]
    looked = lost.look_sweep(sweep.path, {sig: sweep.point(sig) for sig in points})
    runs = [looked[sig].run for sig in points]
    records, never = status.query_run(*runs)
    rows = []
    for (sig, entry), run in zip(points.items(), runs):
        alive = Alive(run, lambda: True)  # a local task without an outcome: RUNNING while its process runs
        tasks = [("NEVER" if t["job_id"] in never else status.task_state(t, records, lambda t=t: status.left_behind(
                  run, t["stage"], t["item"], t["job_id"], lambda: alive.running(t), in_sweep=True)))
                 for t in run.tasks()]
        state = next((s for s in PRECEDENCE if s in tasks), "COMPLETED" if tasks else NOT_SUBMITTED)
        rows.append(PointStatus(sig, entry["overrides"], entry.get("in_grid", True), state,
                                f"{tasks.count('COMPLETED')}/{len(tasks)}", latest_metric(run.path), str(run.path),
                                sum(s in scheduler.ACTIVE for s in tasks),
                                "; ".join(sorted(set(lost.notes(looked[sig]).values())))))
    return rows


def latest_metric(point: Path, shown: int = 4) -> str:
    """The newest metrics.json under a point's stage or task directories, as 'stage[item] k=v ...'
    (its numbers only)."""
    found = [p for pattern in ("*/metrics.json", "*/task-*/metrics.json") for p in point.glob(pattern)]
    for path in sorted(found, key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written: the next newest
        if not isinstance(data, dict):
            continue
        where = path.parent.relative_to(point).parts
        name = where[0] + (f"[{where[1][len('task-'):]}]" if len(where) > 1 else "")
        numbers = [f"{k}={v:.4g}" for k, v in sorted(data.items())
                   if isinstance(v, (int, float)) and not isinstance(v, bool)]
        return f"{name} {' '.join(numbers[:shown])}".strip()
    return ""


def format_table(rows: List[PointStatus]) -> str:
    """A line of points by state, then one row per point, failed and running ones first, then a line
    for each point with a note."""
    head = ("POINT", "OVERRIDES", "STATE", "TASKS", "METRIC")
    rows = sorted(rows, key=lambda r: table.rank(r.state))
    body = [(r.point, describe(r.overrides) + ("" if r.in_grid else " (not in grid)"), r.state, r.tasks,
             r.metric) for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head, *body]]
    notes = [f"{r.point}: {r.note}" for r in rows if r.note]
    return "\n".join([table.by_state([r.state for r in rows], "point"), *lines, *notes])


def json_rows(rows: List[PointStatus]) -> List[Dict[str, Any]]:
    """The rows as `hpc.status --json` prints them for a sweep (hpc.Sweep.status returns the same)."""
    return json.loads(json.dumps([asdict(r) for r in rows], default=str))


def show(path: str, as_json: bool) -> int:
    """hpc.status on a sweep directory."""
    rows = collect(SweepDir(path))
    print(json.dumps(json_rows(rows), indent=1) if as_json else format_table(rows))
    return 0


def follow(sweep: SweepDir, interval_s: float = 5.0) -> int:
    """Print the table whenever it changes until no task of any point is queued or running (a
    point shown FAILED may still run its other tasks); non-zero unless every point in the grid
    completed."""
    last = None
    while True:
        rows = collect(sweep)
        table = format_table(rows)
        if table != last:
            print(time.strftime("%H:%M:%S"), table, sep="\n", flush=True)
            last = table
        if not any(r.active for r in rows):
            return 0 if all(r.state == "COMPLETED" for r in rows if r.in_grid) else 1
        time.sleep(interval_s)
