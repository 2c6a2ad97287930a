"""The run directory: manifest, resolved config, per-stage/task folders and done markers.

    python -m hpc.status runs/langsplat-20260101-120000     # reads what this module writes

Layout:
    <run>/manifest.json        pipeline, git commit, submissions (time, job ids per stage and task,
                               the job ids each job waits for)
    <run>/config.yaml          the resolved config
    <run>/<stage>/logs/<jobid>/<jobid>_<rank>_log.{out,err}   submitit's per-rank logs
    <run>/<stage>/[task-<item>/]  done, checkpoints/, tensorboard/, outputs
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple

DONE = "done"


class RunDir:
    def __init__(self, path: os.PathLike | str):
        self.path = Path(path).resolve()

    @property
    def manifest_path(self) -> Path:
        return self.path / "manifest.json"

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    def task_dir(self, stage: str, item: Any = None) -> Path:
        base = self.path / stage
        return base if item is None else base / f"task-{item}"

    def is_done(self, stage: str, item: Any = None) -> bool:
        return (self.task_dir(stage, item) / DONE).exists()

    def mark_done(self, stage: str, item: Any, info: Dict[str, Any]) -> None:
        atomic_write_text(self.task_dir(stage, item) / DONE, json.dumps(info, default=str, indent=1))

    def finished(self, keys: List[Tuple[str, Any]]) -> FrozenSet[Tuple[str, Any]]:
        return frozenset(k for k in keys if self.is_done(*k))

    # ---- manifest
    def manifest(self) -> Dict[str, Any]:
        if not self.manifest_path.exists():
            return {}
        return json.loads(self.manifest_path.read_text())

    def start(self, pipeline: str, config_yaml: str, kind: str) -> None:
        """Create the directory (or reopen it) and save config.yaml; keeps earlier submissions."""
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.config_path, config_yaml)
        data = self.manifest() or {"pipeline": pipeline, "submissions": [], "tasks": {}}
        data.update(pipeline=pipeline, executor=kind, git_commit=git_commit(), updated=_now())
        self._write(data)

    def record(self, stage: str, item: Any, job_id: str, kind: str, after: Sequence[str] = ()) -> None:
        """Remember the job that runs (stage, item); older attempts stay in the history.
        `after`: the job ids it waits for (afterok), so status can tell when it never will start."""
        self.record_all(stage, [(item, job_id)], kind, after)

    def record_all(self, stage: str, jobs: Sequence[Tuple[Any, str]], kind: str,
                   after: Sequence[str] = ()) -> None:
        """record() for every (item, job_id) of one submission (an array): one manifest write."""
        data = self.manifest()
        for item, job_id in jobs:
            entry = data["tasks"].setdefault(task_key(stage, item), {"stage": stage, "item": item, "jobs": []})
            entry["jobs"].append({"job_id": job_id, "executor": kind, "submitted": _now(), "after": list(after)})
            entry["job_id"] = job_id
            data["submissions"].append({"time": _now(), "stage": stage, "item": item, "job_id": job_id})
        self._write(data)

    def tasks(self) -> List[Dict[str, Any]]:
        return list(self.manifest().get("tasks", {}).values())

    def slurm_jobs(self, stage: Optional[str] = None) -> List[str]:
        """Latest job id of each task that went to SLURM (local jobs have no scheduler to ask)."""
        return [t["job_id"] for t in self.tasks()
                if t["jobs"][-1]["executor"] == "slurm" and stage in (None, t["stage"])]

    def dependencies(self) -> Dict[str, List[str]]:
        """Latest job of each task -> the job ids it waits for (afterok)."""
        return {t["job_id"]: t["jobs"][-1].get("after", []) for t in self.tasks()}

    def job_tasks(self) -> Dict[str, str]:
        """Every job id ever recorded (all attempts) -> its task key, e.g. 'second[1]'."""
        return {j["job_id"]: task_key(t["stage"], t["item"]) for t in self.tasks() for j in t["jobs"]}

    def _write(self, data: Dict[str, Any]) -> None:
        atomic_write_text(self.manifest_path, json.dumps(data, indent=1, default=str))

    # ---- logs
    def log_path(self, stage: str, job_id: str, rank: int = 0, stream: str = "out") -> Path:
        return self.path / stage / "logs" / job_id / f"{job_id}_{rank}_log.{stream}"


def task_key(stage: str, item: Any) -> str:
    return stage if item is None else f"{stage}[{item}]"


def git_commit(cwd: Optional[Path] = None) -> Optional[str]:
    """Commit of the code being submitted (None outside a git checkout)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd or Path(__file__).parent,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def atomic_write_text(path: Path, text: str) -> None:
    # tmp name + rename: a reader (status, a resubmission) never sees half a manifest.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
