"""The sweep directory: the grid it records, one run directory per point, and how a point is named in words.

    python -m hpc.status runs/tiny-20260101-120000      # a sweep dir: one row per point

Layout:
    <sweep>/sweep.json            pipeline, grid, the overrides and profile every point shares, and
                                  every point ever submitted (signature -> overrides, in the grid or not)
    <sweep>/<signature>/          a point: a run directory (hpc.rundir.run) of its own
    <sweep>/<signature>/<stage>/logs -> ../../<stage>/logs   (its array tasks' logs; each task links it
                                  when it starts, hpc.pipeline.executor.StageTask; shared_logs before)
    <sweep>/<stage>/logs/<jobid>/ submitit's logs of the stage's array, all points together
    <sweep>/<stage>/logs/points-<id>.txt   the point of each task of one array, line k for task k
                                  (hpc.afterstep --points: run_for reads it, not every point's manifest)
    <sweep>/<stage>/logs/tasks-<id>.bin    the pickles of one array's tasks (hpc.pipeline.arraytasks)

A point removed from the grid keeps its directory: it is reported, never deleted, and still shown.
"""
from __future__ import annotations

import contextlib
import json
import os
import uuid
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from hpc.fs import atomic
from hpc.rundir import logdirs
from hpc.rundir.run import MANIFEST, RunDir, RunDirError

RECORD = "sweep.json"
# The record at the top of each directory hpc makes, and keys only hpc's JSON holds: a user's own
# manifest.json (a web app's, a browser extension's) is not one.
MARKERS = ((MANIFEST, ("tasks", "submissions")), (RECORD, ("points", "grid")))


def is_sweep(path: Optional[str]) -> bool:
    return bool(path) and (Path(path) / RECORD).is_file()


def made_by_hpc(directory: str) -> bool:
    """Whether `directory` is a run or sweep directory hpc made, by the record it keeps at its top
    (a code snapshot leaves such a directory out: its checkpoints and logs are not code)."""
    for name, keys in MARKERS:
        try:
            with open(os.path.join(directory, name), "rb") as fh:
                data = json.loads(fh.read())
        except (OSError, ValueError):  # absent (the usual case: one failed open), or not JSON
            continue
        if isinstance(data, dict) and all(k in data for k in keys):
            return True
    return False


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
        return RunDir.at(self.path / signature)  # the sweep's path is resolved, a signature is a plain name

    def removed(self, points: Sequence[Any]) -> List[str]:
        """Lines naming the recorded points that `points` (hpc.sweep.grid.Point) no longer holds."""
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
        atomic.write_text(self.record_path, json.dumps(
            {"pipeline": pipeline, "grid": grid, "overrides": list(overrides), "profile": profile,
             "points": table}, indent=1, default=str))

    def link_logs(self, signature: str, stage: str) -> None:
        """<point>/<stage>/logs -> the stage's shared log folder, so a point reads its tasks' logs
        where a run keeps them (hpc.status, hpc.logs). Two calls, and nothing raised, for a new point."""
        stage_dir = os.path.join(self.path, signature, stage)
        try:
            os.mkdir(stage_dir)
        except FileExistsError:
            pass
        except FileNotFoundError:  # a point without its config.yaml yet
            os.makedirs(stage_dir, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.symlink(os.path.join("..", "..", stage, "logs"), os.path.join(stage_dir, "logs"))

    def write_points(self, stage: str, points: Sequence[str], task_ids: Sequence[int] = ()) -> str:
        """A file naming the point of each task of one array (line k: the signature of array task k,
        "-" for an id the array does not hold; a packed array's task: its points, joined by ","), before the array is submitted: its batch script passes
        it to hpc.afterstep (--points), which finds its task's point by reading this one file
        (run_for). `task_ids`: the array's task ids when they are not 0..n-1 (hpc.pipeline.arrays).
        Returns its path."""
        folder = self.path / stage / "logs"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"points-{uuid.uuid4().hex[:12]}.txt"
        by_id = dict(zip(task_ids or range(len(points)), points))
        lines = [by_id.get(i, "-") for i in range(max(by_id, default=-1) + 1)]
        atomic.write_text(path, "".join(f"{sig}\n" for sig in lines))
        return str(path)


def item_log(job_id: str, item: Any, point: Optional[str] = None) -> str:
    """The log name of a packed item's ranks, without `_<rank>_log.out|err`: `<job>.item-<item>`
    (hpc.pipeline.packrun writes it, hpc.status and hpc.logs read it). A sweep's packed points share
    their array task: `<job>.item-<point>` for a point's one task, `<job>.item-<point>-<item>` else."""
    label = item if point is None else point if item is None else f"{point}-{item}"
    return f"{job_id}.item-{label}"


def run_for(path: Any, job_id: str, points: Optional[str] = None) -> RunDir:
    """The run directory that recorded job `job_id` ('12_3'): `path` itself, or for a sweep, whose
    arrays serve every point, the point its array's `points` file (SweepDir.write_points) names at
    the task's index: one file read, whatever the number of points. Without that file (a batch
    script of an older submission), the point whose manifest names the job (`path` when none does)."""
    if not is_sweep(str(path)):
        return RunDir(path)
    sweep = SweepDir(path)
    _, _, index = job_id.partition("_")
    if points and index.isdigit():
        try:
            with open(points, encoding="utf-8") as fh:
                names = fh.read().split()
        except OSError:
            names = []
        if int(index) < len(names) and all(c.isalnum() for c in names[int(index)]):
            return sweep.point(names[int(index)])
    for sig in sweep.record()["points"]:
        run = sweep.point(sig)
        if any(j["job_id"] == job_id for t in run.tasks() for j in t["jobs"]):
            return run
    return RunDir(path)


def shared_logs(run: RunDir, stage: str, job_id: str) -> Optional[Path]:
    """Where a sweep point's task keeps its logs before its <point>/<stage>/logs link exists (its
    task makes it when it starts: hpc.pipeline.executor.StageTask; one that failed before that has
    none): the sweep's <stage>/logs/<job_id> (an array task's: its array's, hpc.rundir.logdirs). None
    for a run that is no sweep's point."""
    folder = logdirs.folder(run.path.parent / stage / "logs", job_id)
    return folder if is_sweep(str(run.path.parent)) and folder.is_dir() else None


def describe(overrides: Mapping[str, Any]) -> str:
    """'tiny.score=1 tiny.sleep_s=0.5': a point's overrides as a user would type them."""
    return " ".join(f"{k}={v if isinstance(v, str) else json.dumps(v, default=str, separators=(',', ':'))}"
                    for k, v in overrides.items())


def slurm_jobs(path: str, stage: Optional[str]) -> List[str]:
    """The SLURM job ids a run directory records, or all of a sweep's points (deduplicated: a
    sweep's stage is one array job across its points)."""
    if not is_sweep(path):
        return RunDir(path).slurm_jobs(stage)
    sweep = SweepDir(path)
    runs = [sweep.point(sig) for sig in sweep.record()["points"]]
    return sorted({jid for run in runs if run.manifest_path.exists() for jid in run.slurm_jobs(stage)})
