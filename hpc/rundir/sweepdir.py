"""The sweep directory: the grid it records, one run directory per point, and its status per point.

    python -m hpc.status runs/tiny-20260101-120000      # a sweep dir: one row per point

Layout:
    <sweep>/sweep.json            pipeline, grid, the overrides and profile every point shares, and
                                  every point ever submitted (signature -> overrides, in the grid or not)
    <sweep>/<signature>/          a point: a run directory (hpc.rundir.run) of its own
    <sweep>/<signature>/<stage>/logs -> ../../<stage>/logs   (its array tasks' logs)
    <sweep>/<stage>/logs/<jobid>/ submitit's logs of the stage's array, all points together

A point removed from the grid keeps its directory: it is reported, never deleted, and still shown.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from hpc.slurm import scheduler
from hpc.rundir.run import RunDir, RunDirError, atomic_write_text

RECORD = "sweep.json"
# A point's state from its tasks' states: the first row that any task is in wins (a table, not branches).
PRECEDENCE = ("NEVER", "FAILED", "TIMEOUT", "CANCELLED", "ENDED", "UNKNOWN", "RUNNING", "PREEMPTED", "PENDING")
NOT_SUBMITTED = "NOT SUBMITTED"


def is_sweep(path: Optional[str]) -> bool:
    return bool(path) and (Path(path) / RECORD).is_file()


class SweepDir:
    def __init__(self, path: Any):
        self.path = Path(path).resolve()

    @property
    def record_path(self) -> Path:
        return self.path / RECORD

    def record(self) -> Dict[str, Any]:
        """sweep.json, or {} before the first submission; a damaged one is a RunDirError."""
        if not self.record_path.exists():
            return {}
        try:
            data = json.loads(self.record_path.read_text())
        except (OSError, ValueError) as err:
            data = str(err).splitlines()[0]
        if not isinstance(data, dict) or not isinstance(data.get("points"), dict):
            raise RunDirError(f"{self.record_path} is not the JSON object python -m hpc.submit --sweep writes "
                              f"({str(data)[:60]}); expected pipeline, grid and points. HINT: restore it, or "
                              "resubmit with --sweep into a new --run-dir.")
        return data

    def point(self, signature: str) -> RunDir:
        return RunDir(self.path / signature)

    def removed(self, points: Sequence[Any]) -> List[str]:
        """Lines naming the recorded points that `points` (hpc.sweep.grid.Point) no longer holds."""
        from hpc.sweep.grid import describe

        now = {p.signature for p in points}
        return [f"point {sig} ({describe(entry['overrides'])}) is no longer in the grid: kept in "
                f"{self.path / sig}, nothing submitted" for sig, entry in self.record().get("points", {}).items()
                if sig not in now]

    def save(self, pipeline: str, grid: Dict[str, List[Any]], overrides: Sequence[str], profile: Optional[str],
             points: Sequence[Any]) -> None:
        """Record the grid now submitted: its points, and every earlier point as out of the grid."""
        old = self.record().get("points", {})
        table = {sig: {**entry, "in_grid": False} for sig, entry in old.items()}
        table.update({p.signature: {"overrides": p.overrides, "in_grid": True} for p in points})
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.record_path, json.dumps(
            {"pipeline": pipeline, "grid": grid, "overrides": list(overrides), "profile": profile,
             "points": table}, indent=1, default=str))

    def link_logs(self, signature: str, stage: str) -> None:
        """<point>/<stage>/logs -> the stage's shared log folder, so a point reads its tasks' logs
        where a run keeps them (hpc.status, hpc.logs)."""
        link = self.path / signature / stage / "logs"
        if not link.exists() and not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(Path("..", "..", stage, "logs"))


def run_for(path: Any, job_id: str) -> RunDir:
    """The run directory that recorded job `job_id` ('12_3'): `path` itself, or for a sweep, whose
    arrays serve every point, the point whose manifest names the job (`path` when none does)."""
    if not is_sweep(str(path)):
        return RunDir(path)
    sweep = SweepDir(path)
    for sig in sweep.record()["points"]:
        run = sweep.point(sig)
        if any(j["job_id"] == job_id for t in run.tasks() for j in t["jobs"]):
            return run
    return RunDir(path)


@dataclass
class PointStatus:
    point: str  # signature, the point's directory name
    overrides: Dict[str, Any]
    in_grid: bool
    state: str
    tasks: str  # "done/total"
    metric: str  # the latest metrics.json: "stage[item] key=value ..."
    run_dir: str


def collect(sweep: SweepDir) -> List[PointStatus]:
    """One row per point, from one scheduler call for all points' jobs."""
    from hpc import status

    points = sweep.record()["points"]
    runs = [sweep.point(sig) for sig in points]
    answer = status.query_run(*runs)
    rows = []
    for (sig, entry), run in zip(points.items(), runs):
        tasks = status.collect(run, answer) if run.manifest_path.exists() else []
        states = {t.state for t in tasks}
        state = next((s for s in PRECEDENCE if s in states), "COMPLETED" if tasks else NOT_SUBMITTED)
        done = sum(t.state == "COMPLETED" for t in tasks)
        rows.append(PointStatus(sig, entry["overrides"], entry.get("in_grid", True), state,
                                f"{done}/{len(tasks)}", latest_metric(run.path), str(run.path)))
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
    from hpc.sweep.grid import describe  # imports hpc.config.schema: only when there is a sweep to show

    head = ("POINT", "OVERRIDES", "STATE", "TASKS", "METRIC")
    body = [(r.point, describe(r.overrides) + ("" if r.in_grid else " (not in grid)"), r.state, r.tasks,
             r.metric) for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head, *body])


def main(path: str, as_json: bool) -> int:
    """hpc.status on a sweep directory."""
    rows = collect(SweepDir(path))
    print(json.dumps([asdict(r) for r in rows], indent=1, default=str) if as_json else format_table(rows))
    return 0


def follow(sweep: SweepDir, interval_s: float = 5.0) -> int:
    """Print the table whenever it changes until no point is active; non-zero unless every point in
    the grid completed."""
    last = None
    while True:
        rows = collect(sweep)
        table = format_table(rows)
        if table != last:
            print(time.strftime("%H:%M:%S"), table, sep="\n", flush=True)
            last = table
        if not any(r.state in scheduler.ACTIVE for r in rows):
            return 0 if all(r.state == "COMPLETED" for r in rows if r.in_grid) else 1
        time.sleep(interval_s)
