"""The run directory: manifest, resolved config, per-stage/task folders and done markers.

    python -m hpc.status runs/langsplat-20260101-120000     # reads what this module writes

Layout:
    <run>/manifest.json        pipeline, run id (hpc.rundir.tracking), the user's code version and hpc's
                               (hpc.rundir.codeversion), its snapshot, submissions (time, job ids per stage
                               and task, the job ids each job waits for, the snapshot each job runs), and
                               `planned`: every task a submission set out to submit, submitted or not
    <run>/.sbatch/<token>.json a submission announced before its sbatch (hpc.rundir.intents)
    <run>/config.yaml          the resolved config
    <root>/.hpc-snapshots/<hash>/  the code snapshot the jobs import, in the run root's store (hpc.rundir.snapshot)
    <run>/.submit.lock         held (flock) by the submission that is reading state and writing the manifest
    <run>/<stage>/logs/<jobid>/<jobid>_<rank>_log.{out,err}   submitit's per-rank logs; an array task's
                               in its array's folder, <array>/<array>_<task>_<rank>_log.* (hpc.rundir.logdirs)
    <run>/<stage>/logs/tasks-<id>.bin   an array's task pickles, one file (hpc.pipeline.arraytasks)
    <run>/<stage>/[task-<item>/]  done, checkpoints/, tensorboard/, outputs
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Optional, Sequence, Tuple

from hpc.fs import atomic
from hpc.fs.sharedfs import local_locks, lock_error
from hpc.rundir import logdirs
from hpc.rundir.tracking import new_run_id

DONE = "done"
MANIFEST = "manifest.json"
LOCK = ".submit.lock"
LOCK_WAIT_S = 60.0  # how long a second submission into the same run dir waits before it is refused


class RunDirError(RuntimeError):
    """A run directory that cannot be used: the message says what was seen, what is expected, and a HINT."""


class RunDir:
    _pinned: Optional[Dict[str, Any]] = None  # pin()'s manifest: read once, then served from memory

    def __init__(self, path: os.PathLike | str):
        self.path = Path(path).resolve()

    @classmethod
    def at(cls, resolved: Path) -> "RunDir":
        """A run dir at an already resolved path (a sweep's point): no resolve(), one lstat per
        path component fewer, which counts a thousand points at a time."""
        run = cls.__new__(cls)
        run.path = resolved
        return run

    @classmethod
    def new_at(cls, resolved: Path) -> "RunDir":
        """RunDir.at() for a run dir known to have no manifest yet (a sweep's new point): none is read."""
        run = cls.at(resolved)
        run._pinned = {}
        return run

    def pin(self) -> "RunDir":
        """This run dir with its manifest read once, for a reader that asks for it many times: a
        sweep's plan (tasks, jobs, dependencies per point, the submission lock keeping writers out),
        a status poll (one moment's manifest)."""
        if self._pinned is not None:
            return self
        run = RunDir.at(self.path)
        run._pinned = self.manifest()
        return run

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    def task_dir(self, stage: str, item: Any = None) -> Path:
        base = self.path / stage
        return base if item is None else base / f"task-{item}"

    def is_done(self, stage: str, item: Any = None) -> bool:
        return (self.task_dir(stage, item) / DONE).exists()

    def done_info(self, stage: str, item: Any = None) -> Optional[Dict[str, Any]]:
        """The task's done marker as written: None when there is none, {} when it does not read."""
        try:
            info = json.loads((self.task_dir(stage, item) / DONE).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}
        return info if isinstance(info, dict) else {}

    def mark_done(self, stage: str, item: Any, info: Dict[str, Any]) -> None:
        atomic.write_text(self.task_dir(stage, item) / DONE, json.dumps(info, default=str, indent=1))

    def finished(self, keys: List[Tuple[str, Any]]) -> FrozenSet[Tuple[str, Any]]:
        return frozenset(k for k in keys if self.is_done(*k))

    def check_usable(self) -> None:
        """Refuse, before anything is submitted, a run dir that is a file, sits under a file, or
        cannot be written (the nearest existing directory is what a new run dir would be made in)."""
        hint = "HINT: pass --run-dir a writable directory, or a new path under one."
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(f"run dir {self.path} is a file; expected a directory. {hint}")
        base = self.path
        while not base.exists():
            base = base.parent
        if not base.is_dir():
            raise RunDirError(f"run dir {self.path} sits under {base}, which is a file; expected a directory. {hint}")
        if not os.access(base, os.W_OK | os.X_OK):
            raise RunDirError(f"run dir {self.path}: {base} is read-only; expected a writable directory. {hint}")

    # ---- manifest
    def manifest(self) -> Dict[str, Any]:
        """The manifest, or {} before the first submission; a damaged one is a RunDirError."""
        if self._pinned is not None:
            return self._pinned
        if not self.manifest_path.exists():
            return {}
        try:
            data = json.loads(self.manifest_path.read_bytes())
        except (OSError, ValueError) as err:  # empty, truncated, binary (UnicodeDecodeError), a directory
            raise self._damaged(f"cannot be read as JSON ({str(err).splitlines()[0]})") from None
        if not isinstance(data, dict):
            raise self._damaged(f"holds a JSON {type(data).__name__}")
        if not isinstance(data.get("tasks"), dict) or not isinstance(data.get("submissions"), list) or not all(
                isinstance(t, dict) and {"stage", "item", "job_id", "jobs"} <= set(t) for t in data["tasks"].values()):
            raise self._damaged("lacks its 'tasks' and 'submissions' entries")
        return data

    def _damaged(self, what: str) -> RunDirError:
        return RunDirError(f"{self.manifest_path} {what}; expected the JSON object written by python -m hpc.submit. "
                           "HINT: restore it, or move it away to start the run's bookkeeping afresh "
                           "(done markers are kept, so finished tasks are still skipped).")

    def start(self, pipeline: str, config_yaml: str, kind: str, code: Optional[Dict[str, Any]] = None,
              planned: Sequence[Tuple[str, Any]] = ()) -> str:
        """Create the directory (or reopen it) and save config.yaml; keeps earlier submissions.
        `code`: the submitted code's version (code_version()) and its snapshot, recorded with this
        submission; `planned`: the (stage, item) of each task it is about to submit, so that status
        shows those it never did. Returns the run id (hpc.rundir.tracking), made at the first
        submission and kept."""
        self.path.mkdir(parents=True, exist_ok=True)
        atomic.write_text(self.config_path, config_yaml)
        data = self.begin(pipeline, kind, code)
        add_planned(data, planned)
        self.write_manifest(data)
        return data["run_id"]

    def begin(self, pipeline: str, kind: str, code: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """start()'s manifest, in memory: the caller writes it (write_manifest) once its jobs are added."""
        data = self.manifest() or {"pipeline": pipeline, "submissions": [], "tasks": {}}
        data.setdefault("run_id", new_run_id(self.path.name))
        data.update(pipeline=pipeline, executor=kind, updated=_now(), **(code or {}))
        return data

    def record(self, stage: str, item: Any, job_id: str, kind: str, after: Sequence[str] = ()) -> None:
        """Remember the job that runs (stage, item); older attempts stay in the history.
        `after`: the job ids it waits for (afterok), so status can tell when it never will start."""
        self.record_all(stage, [(item, job_id)], kind, after)

    def record_all(self, stage: str, jobs: Sequence[Tuple[Any, str]], kind: str,
                   after: Sequence[str] = (), each_after: Sequence[Sequence[str]] = (),
                   code: Optional[str] = None) -> None:
        """record() for every (item, job_id) of one submission (an array): one manifest write.
        `each_after`: per job, the further job ids it alone waits for (its own task, aftercorr).
        `code`: the hash of the snapshot the jobs run (None: the live tree)."""
        data = self.manifest()
        add_jobs(data, stage, jobs, kind, after, each_after, code)
        self.write_manifest(data)

    def tasks(self) -> List[Dict[str, Any]]:
        return list(self.manifest().get("tasks", {}).values())

    def unsubmitted(self) -> List[Tuple[str, Any]]:
        """(stage, item) of each task a submission planned that no job was ever recorded for."""
        tasks = self.manifest().get("tasks", {})
        planned = self.manifest().get("planned") or {}
        return [(stage, item) for stage, items in planned.items() for item in items
                if task_key(stage, item) not in tasks]

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

    def write_manifest(self, data: Dict[str, Any]) -> None:
        # one line: json's C encoder, 3x faster than its indenting one, which a sweep pays per point
        atomic.write_text(self.manifest_path, json.dumps(data, default=str))

    # ---- one submission at a time
    @contextlib.contextmanager
    def submission_lock(self, wait_s: Optional[float] = None, say: Callable[[str], None] = print) -> Iterator[None]:
        """Hold the run dir's lock from reading its state to the last manifest write, so that two
        submissions into one run dir neither lose each other's manifest entries nor both run every
        task. A second submission waits up to `wait_s` (default LOCK_WAIT_S), saying so once, then
        is refused. flock belongs to the open file: it is released when the holder exits, however it
        exits, and it works across NFS clients (Linux emulates it with POSIX locks there). A mount
        whose locks are node-local (Lustre's localflock, NFS's nolock) gets a warning, since they keep
        nothing on other nodes out; a filesystem without locks is refused with the reason."""
        wait_s = LOCK_WAIT_S if wait_s is None else wait_s
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline, told = time.monotonic() + wait_s, False
            warning = local_locks(self.path)
            say(f"warning: {warning}") if warning else None
            while not _try_lock(fd, self.path / LOCK):
                holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "a process"
                if time.monotonic() >= deadline:
                    raise RunDirError(
                        f"run dir {self.path} is being submitted to by {holder}, still after {wait_s:g} s; "
                        "expected one submission at a time. HINT: wait until that submission returns "
                        "(python -m hpc.status shows the run), or pass another --run-dir.")
                if not told:
                    say(f"waiting up to {wait_s:g} s for {holder}, which is submitting into {self.path}")
                    told = True
                time.sleep(0.25)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {_now()}\n".encode(), 0)
            yield
        finally:
            os.close(fd)

    # ---- logs
    def log_path(self, stage: str, job_id: str, rank: int = 0, stream: str = "out") -> Path:
        return logdirs.folder(self.path / stage / "logs", job_id) / f"{job_id}_{rank}_log.{stream}"


def _try_lock(fd: int, path: Path) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as err:  # a filesystem without locks: say so, not "no space" (hpc.fs.sharedfs)
        problem = lock_error(path, err)
        if problem is None:
            raise
        raise RunDirError(problem) from None
    return True


def add_jobs(data: Dict[str, Any], stage: str, jobs: Sequence[Tuple[Any, str]], kind: str,
             after: Sequence[str] = (), each_after: Sequence[Sequence[str]] = (), code: Optional[str] = None,
             token: Optional[str] = None) -> None:
    """RunDir.record_all() on a manifest in memory (RunDir.begin's), for a writer that adds every
    stage before its one write. `token`: the jobs were found by it, sbatch's answer lost (hpc.monitor.lost)."""
    now = _now()
    for n, (item, job_id) in enumerate(jobs):
        entry = data["tasks"].setdefault(task_key(stage, item), {"stage": stage, "item": item, "jobs": []})
        waits = list(after) + [j for j in (each_after[n] if n < len(each_after) else ()) if j]
        job = {"job_id": job_id, "executor": kind, "submitted": now, "after": waits, "code": code}
        entry["jobs"].append({**job, "found_by_token": token} if token else job)
        entry["job_id"] = job_id
        data["submissions"].append({"time": now, "stage": stage, "item": item, "job_id": job_id})


def add_planned(data: Dict[str, Any], planned: Sequence[Tuple[str, Any]]) -> None:
    """The manifest's `planned` ({stage: [items]}) with the (stage, item) of `planned` added once each."""
    plan = data.setdefault("planned", {})
    known = {task_key(stage, item) for stage, items in plan.items() for item in items}
    for stage, item in planned:
        if task_key(stage, item) not in known:
            known.add(task_key(stage, item))
            plan.setdefault(stage, []).append(item)


def task_key(stage: str, item: Any) -> str:
    return stage if item is None else f"{stage}[{item}]"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
