"""A run, or a sweep, as an object: where it stands, its logs, metrics and outputs, waiting, cancelling.

    import hpc
    run = hpc.Run.attach("runs/langsplat-20260101-120000")   # a Sweep for a sweep's directory
    run.status()            # the rows of python -m hpc.status --json
    run.wait(timeout=600)   # the same rows once no task is queued or running; TimeoutError after `timeout`
    run.logs("features", 1, rank=0)   # the text of that rank's stdout log (err=True: stderr)
    run.metrics()           # task -> its metrics.json;  run.outputs(): task -> the files it made
    run.cancel()            # scancel of every queued or running job; done tasks keep their markers

Everything is read from the run directory and one scheduler call per status (hpc.monitor); the
commands python -m hpc.status, hpc.logs and hpc.cancel call these methods and print. A Run holds
only its path: any number of them, in any process, see the same run.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from hpc.fs.sharedfs import listed
from hpc.monitor import logs as tasklogs
from hpc.monitor import status as hstatus
from hpc.monitor import sweeps
from hpc.rundir import sweepdir
from hpc.rundir.run import RunDir, RunDirError, task_key
from hpc.slurm import scheduler

POLL_S = 2.0  # wait()'s interval between scheduler calls: one sacct per poll, whatever the run's size


class Run:
    """One run directory (made by hpc.submit or python -m hpc.submit)."""

    def __init__(self, path: Any):
        self.path = Path(path).resolve()

    def __repr__(self) -> str:
        return f"hpc.Run({str(self.path)!r})"

    @staticmethod
    def attach(path: Any) -> Union["Run", "Sweep"]:
        """The run (or sweep) in `path`; RunDirError when it is neither."""
        check(str(path))
        return Sweep(path) if sweepdir.is_sweep(str(path)) else Run(path)

    def rows(self) -> List[hstatus.TaskStatus]:
        return hstatus.collect(RunDir(self.path))

    def status(self) -> List[Dict[str, Any]]:
        """One dict per task: what python -m hpc.status --json prints."""
        return [asdict(r) for r in self.rows()]

    def wait(self, timeout: Optional[float] = None, poll_s: float = POLL_S) -> List[Dict[str, Any]]:
        """Poll until no task is queued or running; the final status(). TimeoutError after `timeout`
        seconds (the jobs go on). Jobs that can never start (NEVER) end the wait: nothing will move them."""
        return _wait(self.status, timeout, poll_s, f"run {self.path}")

    def done(self) -> bool:
        """Whether every task completed."""
        states = [r["state"] for r in self.status()]
        return bool(states) and all(s == "COMPLETED" for s in states)

    def log_paths(self, stage: Optional[str] = None, task: Any = None, rank: int = 0,
                  err: bool = False) -> List[Path]:
        """The log file of each chosen task's newest job (every task of `stage`, or of the run, when
        not narrowed); RunDirError or ValueError names what exists."""
        return tasklogs.select(RunDir(self.path), stage, None if task is None else str(task), rank,
                               "err" if err else "out")

    def logs(self, stage: Optional[str] = None, task: Any = None, rank: int = 0, err: bool = False) -> str:
        """The text of those logs, each after a '==> path <==' line when there are several."""
        paths = self.log_paths(stage, task, rank, err)
        texts = [p.read_text(errors="replace") if p.exists() else "" for p in paths]
        if len(paths) == 1:
            return texts[0]
        return "\n".join(f"==> {p} <==\n{t}" for p, t in zip(paths, texts))

    def metrics(self) -> Dict[str, Any]:
        """Task ('stage[item]') -> the content of its metrics.json, for the tasks that wrote one."""
        run, found = RunDir(self.path), {}
        for t in run.tasks():
            where = run.task_dir(t["stage"], t["item"])
            if "metrics.json" in listed(where):
                try:
                    found[task_key(t["stage"], t["item"])] = json.loads((where / "metrics.json").read_text())
                except ValueError:
                    continue  # being rewritten: absent this time
        return found

    def outputs(self) -> Dict[str, List[Path]]:
        """Task -> the files and directories it made in its directory (what hpc.status lists)."""
        run = RunDir(self.path)
        out = {}
        for t in run.tasks():
            where = run.task_dir(t["stage"], t["item"])
            out[task_key(t["stage"], t["item"])] = [where / n for n in hstatus.outputs(listed(where))]
        return out

    def cancel(self, stage: Optional[str] = None) -> List[str]:
        """scancel every queued or running job of the run (of `stage`); returns the job ids cancelled."""
        return cancel(str(self.path), stage)


class Sweep:
    """A sweep directory: one run per point (Sweep.points()), each stage one array job across them."""

    def __init__(self, path: Any):
        self.path = Path(path).resolve()

    def __repr__(self) -> str:
        return f"hpc.Sweep({str(self.path)!r})"

    def points(self) -> Dict[str, Run]:
        """Point signature -> its Run."""
        record = sweepdir.SweepDir(self.path)
        return {sig: Run(record.point(sig).path) for sig in record.record()["points"]}

    def status(self) -> List[Dict[str, Any]]:
        """One dict per point: what python -m hpc.status --json prints for a sweep."""
        return sweeps.json_rows(sweeps.collect(sweepdir.SweepDir(self.path)))

    def wait(self, timeout: Optional[float] = None, poll_s: float = POLL_S) -> List[Dict[str, Any]]:
        return _wait(self.status, timeout, poll_s, f"sweep {self.path}")

    def cancel(self, stage: Optional[str] = None) -> List[str]:
        return cancel(str(self.path), stage)


def _wait(status: Any, timeout: Optional[float], poll_s: float, what: str) -> List[Dict[str, Any]]:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        rows = status()
        if not any(r["state"] in scheduler.ACTIVE for r in rows):
            return rows
        if deadline is not None and time.monotonic() + poll_s > deadline:
            states = sorted({r["state"] for r in rows})
            raise TimeoutError(f"{what} still has active tasks after {timeout} s ({', '.join(states)}); its jobs "
                               "go on. HINT: wait(timeout=...) longer, or .cancel().")
        time.sleep(poll_s)


def check(path: str, stage: Optional[str] = None) -> None:
    """Refuse a path that is neither a run nor a sweep, and a stage that none of its tasks has."""
    run = RunDir(path)
    sweep = sweepdir.is_sweep(path)
    if not sweep and not run.manifest_path.is_file():
        raise RunDirError(f"{run.manifest_path} not found; expected a run directory made by python -m hpc.submit "
                          "(or a sweep's). HINT: pass the 'run dir:' or 'sweep dir:' path printed at submission.")
    if stage is None:
        return
    runs: List[RunDir] = [run]
    if sweep:
        record = sweepdir.SweepDir(path)
        runs = [record.point(sig) for sig in record.record()["points"]]
    stages = sorted({t["stage"] for r in runs if r.manifest_path.is_file() for t in r.tasks()})
    if stage not in stages:
        raise RunDirError(f"stage {stage!r} not in {path}; expected one of {stages}. HINT: --stage NAME, "
                          "or no --stage for every stage.")


def cancel(path: str, stage: Optional[str] = None) -> List[str]:
    """One scancel for the latest job of every task still queued or running (of a run or of every
    point of a sweep, whose stages share array jobs); returns the ids cancelled. Refuses what check()
    refuses: 'nothing to cancel' there would leave one believing the jobs were cancelled."""
    check(path, stage)
    slurm_ids = sweepdir.slurm_jobs(path, stage)
    if not slurm_ids:
        return []
    records = scheduler.query(slurm_ids)
    # a job submitted a moment ago may not be in the accounting yet: unknown counts as active
    active = [jid for jid in slurm_ids if jid not in records or records[jid].state in scheduler.ACTIVE]
    return scheduler.cancel(active)
