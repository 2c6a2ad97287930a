"""A run, or a sweep, as an object: where it stands, its logs, metrics and outputs, waiting, cancelling.

    import hpc
    run = hpc.Run.attach("runs/langsplat-20260101-120000")   # a Sweep for a sweep's directory
    run.status()            # the rows of python -m hpc.status --json
    run.wait(timeout=600)   # the same rows once no task is queued or running; TimeoutError after `timeout`
    run.logs("features", 1, rank=0)   # the text of that rank's stdout log (err=True: stderr)
    run.metrics()           # task -> its metrics.json;  run.outputs(): task -> the files it made
    run.metrics(goodput=True)   # ... and each task's 'goodput': python -m hpc.status --cost's figures
    run.result("merge")     # what the stage function returned (item=...: that array task's)
    run.cancel()            # scancel of every queued or running job; done tasks keep their markers
    sweep.metrics()         # a Sweep: point -> task -> ...; sweep.logs(point, ...), sweep.result(point, ...)

Everything is read from the run directory and one scheduler call per status (hpc.monitor); the
commands python -m hpc.status, hpc.logs and hpc.cancel call these methods and print. A Run holds
only its path: any number of them, in any process, see the same run. Constructing one refuses a
path that is not a run (a Sweep: not a sweep) with a RunDirError (hpc.rundir.kind); cancelling goes
through hpc.monitor.runjobs, as python -m hpc.cancel does.
"""
from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Union

from hpc.fs.sharedfs import listed
from hpc.remote import watch as remote
from hpc.rundir import sweepdir
from hpc.rundir.kind import check, refuse_unless
from hpc.rundir.run import RunDir, RunDirError, task_key
from hpc.slurm import scheduler

if TYPE_CHECKING:
    from hpc.monitor.status import TaskStatus
    from hpc.remote.watch import RemoteRun

POLL_S = 2.0  # wait()'s interval between scheduler calls: one sacct per poll, whatever the run's size


class Run:
    """One run directory (made by hpc.submit or python -m hpc.submit)."""

    def __init__(self, path: Any):
        self.path = Path(path).resolve()
        refuse_unless(self.path, "run")

    def __repr__(self) -> str:
        return f"hpc.Run({str(self.path)!r})"

    @staticmethod
    def attach(path: Any) -> Union["Run", "Sweep", "RemoteRun"]:
        """The run (or sweep) in `path`, or on a named cluster: NAME:RUN_DIR (hpc.remote.watch);
        RunDirError when it is neither."""
        found = remote.attach(str(path))
        if found is not None:
            return found
        check(str(path))
        return Sweep(path) if sweepdir.is_sweep(str(path)) else Run(path)

    def rows(self) -> List[TaskStatus]:
        # the monitor loads at a run's first look at its tasks: hpc.submit() returns a Run without it
        from hpc.monitor import status as hstatus

        return hstatus.collect(RunDir(self.path))

    def status(self) -> List[Dict[str, Any]]:
        """One dict per task: what python -m hpc.status --json prints."""
        return [asdict(r) for r in self.rows()]

    def wait(self, timeout: Optional[float] = None, poll_s: float = POLL_S) -> List[Dict[str, Any]]:
        """Poll until no task is queued or running; the final status(). TimeoutError after `timeout`
        seconds (the jobs go on). Jobs that can never start (NEVER) end the wait: nothing will move them."""
        return _wait(self.status, lambda r: r["state"] in scheduler.ACTIVE, timeout, poll_s, f"run {self.path}")

    def done(self) -> bool:
        """Whether every task completed."""
        states = [r["state"] for r in self.status()]
        return bool(states) and all(s == "COMPLETED" for s in states)

    def log_paths(self, stage: Optional[str] = None, task: Any = None, rank: int = 0,
                  err: bool = False) -> List[Path]:
        """The log file of each chosen task's newest job (every task of `stage`, or of the run, when
        not narrowed); RunDirError or ValueError names what exists, ranks included."""
        from hpc.monitor import logs as tasklogs  # as in rows(): on first use

        paths = tasklogs.select(RunDir(self.path), stage, None if task is None else str(task), rank,
                                "err" if err else "out")
        for path in paths:
            _check_rank(path, rank)
        return paths

    def logs(self, stage: Optional[str] = None, task: Any = None, rank: int = 0, err: bool = False) -> str:
        """The text of those logs, each after a '==> path <==' line when there are several."""
        paths = self.log_paths(stage, task, rank, err)
        texts = [p.read_text(errors="replace") if p.exists() else "" for p in paths]
        if len(paths) == 1:
            return texts[0]
        return "\n".join(f"==> {p} <==\n{t}" for p, t in zip(paths, texts))

    def metrics(self, goodput: bool = False) -> Dict[str, Any]:
        """Task ('stage[item]') -> the content of its metrics.json, for the tasks that wrote one;
        `goodput`: every task also gets 'goodput', python -m hpc.status --cost's figures of it
        (GPU- or CPU-hours per part, the share that trained, queue wait; hpc.monitor.cost)."""
        from hpc.monitor import metrics  # as in rows(): on first use

        return metrics.of_run(self.path, goodput)

    def outputs(self) -> Dict[str, List[Path]]:
        """Task -> the files and directories it made in its directory (what hpc.status lists)."""
        from hpc.monitor import status as hstatus  # as in rows(): on first use

        run = RunDir(self.path)
        out = {}
        for t in run.tasks():
            where = run.task_dir(t["stage"], t["item"])
            out[task_key(t["stage"], t["item"])] = [where / n for n in hstatus.outputs(listed(where))]
        return out

    def result(self, stage: str, item: Any = None) -> Any:
        """What the function of `stage` returned in the task of `item` (None: the stage's one task),
        as submitit's job.result() gives it (hpc.monitor.results). ResultError (its `.state`) when
        the task has not completed; ValueError naming the stages or items there are."""
        from hpc.monitor import results  # as in rows(): on first use

        return results.result(RunDir(self.path), stage, item)

    def cancel(self, stage: Optional[str] = None) -> List[str]:
        """scancel every queued or running job of the run (of `stage`); returns the job ids cancelled."""
        from hpc.monitor import runjobs  # as in rows(): on first use

        return runjobs.cancel(str(self.path), stage)


def _point(path: Path) -> Run:
    """A sweep point's Run, unchecked: a point whose jobs are being submitted has no manifest yet."""
    run = Run.__new__(Run)
    run.path = path
    return run


class Sweep:
    """A sweep directory: one run per point (Sweep.points()), each stage one array job across them.
    A point is named by its signature (status()'s 'point') or by its overrides, {'key': value}."""

    def __init__(self, path: Any):
        self.path = Path(path).resolve()
        refuse_unless(self.path, "sweep")

    def __repr__(self) -> str:
        return f"hpc.Sweep({str(self.path)!r})"

    def points(self) -> Dict[str, Run]:
        """Point signature -> its Run."""
        record = sweepdir.SweepDir(self.path)
        return {sig: _point(record.point(sig).path) for sig in record.record()["points"]}

    def point(self, point: Union[str, Mapping[str, Any]]) -> Run:
        """The Run of one point: its signature, or its overrides as status() shows them."""
        sweep = sweepdir.SweepDir(self.path)
        recorded = sweep.record()["points"]
        if isinstance(point, Mapping):
            sig = next((s for s, e in recorded.items() if e["overrides"] == dict(point)), None)
        else:
            sig = point if point in recorded else None
        if sig is None:
            known = [f"{s} {sweepdir.describe(e['overrides'])}" for s, e in list(recorded.items())[:6]]
            raise RunDirError(f"point {point!r} not in sweep {self.path}; expected a signature or the overrides of "
                              f"one of its {len(recorded)} points ({'; '.join(known)}"
                              f"{' ...' if len(recorded) > 6 else ''}). HINT: sweep.status() lists them.")
        return _point(sweep.point(sig).path)

    def status(self) -> List[Dict[str, Any]]:
        """One dict per point: what python -m hpc.status --json prints for a sweep."""
        from hpc.monitor import sweeps  # as in Run.rows(): on first use

        return sweeps.json_rows(sweeps.collect(sweepdir.SweepDir(self.path)))

    def wait(self, timeout: Optional[float] = None, poll_s: float = POLL_S) -> List[Dict[str, Any]]:
        """Poll until no task of any point is queued or running (a point shown FAILED may still run
        others: its `active` count says); the final status(). TimeoutError after `timeout` seconds."""
        return _wait(self.status, lambda r: r["active"] > 0, timeout, poll_s, f"sweep {self.path}")

    def logs(self, point: Union[str, Mapping[str, Any]], stage: Optional[str] = None, task: Any = None,
             rank: int = 0, err: bool = False) -> str:
        """Run.logs of one point."""
        return self.point(point).logs(stage, task, rank, err)

    def metrics(self, goodput: bool = False) -> Dict[str, Dict[str, Any]]:
        """Point signature -> task -> its metrics.json (Run.metrics of each point, `goodput` too:
        one scheduler call for every point)."""
        from hpc.monitor import metrics  # as in Run.rows(): on first use

        return metrics.of_sweep(self.path, {sig: run.path for sig, run in self.points().items()}, goodput)

    def outputs(self) -> Dict[str, Dict[str, List[Path]]]:
        """Point signature -> task -> the files it made (Run.outputs of each point)."""
        return {sig: run.outputs() for sig, run in self.points().items()}

    def result(self, point: Union[str, Mapping[str, Any]], stage: str, item: Any = None) -> Any:
        """Run.result of one point."""
        return self.point(point).result(stage, item)

    def cancel(self, stage: Optional[str] = None) -> List[str]:
        """Run.cancel of every point: one scancel, their stages share array jobs."""
        from hpc.monitor import runjobs  # as in Run.rows(): on first use

        return runjobs.cancel(str(self.path), stage)


def _wait(status: Callable[[], List[Dict[str, Any]]], active: Callable[[Dict[str, Any]], bool],
          timeout: Optional[float], poll_s: float, what: str) -> List[Dict[str, Any]]:
    """Poll `status` until no row is `active`; TimeoutError once `timeout` seconds have passed, not before."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        rows = status()
        if not any(active(r) for r in rows):
            return rows
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            states = sorted({r["state"] for r in rows})
            raise TimeoutError(f"{what} still has active tasks after {timeout} s ({', '.join(states)}); its jobs "
                               "go on. HINT: wait(timeout=...) longer, or .cancel().")
        time.sleep(poll_s if left is None else min(poll_s, left))


def _check_rank(path: Path, rank: int) -> None:
    """Refuse a rank whose log is missing while other ranks of the same job logged: the task has no
    such rank (a job not started yet has no logs at all, and its text is '')."""
    names = listed(path.parent)
    if path.name in names:
        return
    job, _, stream = path.name.rpartition(f"_{rank}_log.")
    tail = f"_log.{stream}"
    ranks = sorted(int(n[len(job) + 1:-len(tail)]) for n in names
                   if n.startswith(f"{job}_") and n.endswith(tail) and n[len(job) + 1:-len(tail)].isdigit())
    if ranks:
        raise ValueError(f"rank {rank} of job {job} has no log in {path.parent}; expected one of the ranks that "
                         f"logged: {ranks}. HINT: rank={ranks[-1]} (--rank {ranks[-1]}), or rank=0.")
