"""A run's task logs: which files, following one as it grows, and the progress they show.

    python -m hpc.logs RUN_DIR [--stage S] [--task I] [--rank R] [--err] [-f]

Logs are kept per stage, task and rank (RunDir.log_path); a log another node writes is waited for
by listing its directory, never by a lookup NFS would answer from its cache (hpc.fs.sharedfs).
"""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any, Callable, Collection, List, Optional

from hpc.fs.sharedfs import listed
from hpc.rundir.run import RunDir, RunDirError
from hpc.rundir.sweepdir import is_sweep, item_log, shared_logs
from hpc.slurm import scheduler


def select(run: RunDir, stage: Optional[str], task: Optional[str], rank: int, stream: str) -> List[Path]:
    if not run.manifest_path.is_file():
        raise RunDirError(f"{run.manifest_path} not found; expected a run directory made by python -m hpc.submit. "
                          "HINT: pass the 'run dir:' path printed at submission.")
    tasks = run.tasks()
    stages = sorted({t["stage"] for t in tasks})
    if stage is not None and stage not in stages:
        raise ValueError(f"stage {stage!r} not in this run; expected one of {stages}. HINT: --stage NAME")
    chosen = [t for t in tasks if (stage is None or t["stage"] == stage)
              and (task is None or str(t["item"]) == str(task))]
    if not chosen:
        items = sorted(str(t["item"]) for t in tasks if stage is None or t["stage"] == stage)
        raise ValueError(f"task {task!r} not found; expected one of {items}. HINT: --task ITEM")
    point = run.path.name if is_sweep(str(run.path.parent)) else None
    return [_log_path(run, t["stage"], t["job_id"], t["item"], point, rank, stream) for t in chosen]


def _log_path(run: RunDir, stage: str, job_id: str, item: Any, point: Optional[str], rank: int, stream: str) -> Path:
    """RunDir.log_path, or a sweep point's in the sweep's logs where its task never linked them; a
    packed item's own log where its job wrote one (packed)."""
    path = run.log_path(stage, job_id, rank, stream)
    shared = None if path.parent.is_dir() else shared_logs(run, stage, job_id)
    folder = shared or path.parent
    own = packed(listed(folder) if folder.is_dir() else (), job_id, item, point, rank)
    return folder / (f"{own}.{stream}" if own else path.name)


def packed(names: Collection[str], job_id: str, item: Any, point: Optional[str] = None, rank: int = 0
           ) -> Optional[str]:
    """The log stem of a packed item's rank (`<job>.item-<item>_<rank>_log`, hpc.rundir.sweepdir.item_log)
    where its folder's listing `names` holds it; None for a job that ran no packed item of that name.
    `point`: a sweep point's signature (its points share their packed job's folder)."""
    stem = f"{item_log(job_id, item, point)}_{rank}_log"
    return stem if f"{stem}.out" in names or f"{stem}.err" in names else None


def follow(path: Path, poll_s: float = 1.0, job_id: Optional[str] = None, check_s: float = 5.0) -> None:
    """Like tail -f: print what is appended until interrupted; given the task's `job_id`, until its
    job has ended, then the rest of the log. The scheduler is asked once per `check_s` of quiet, never
    while the log grows; a job it no longer knows has ended (a requeued one is still queued)."""
    ended = _ended(job_id, check_s)
    while path.name not in listed(path.parent):  # a listing, not a lookup NFS would answer from its cache
        if ended():
            return
        time.sleep(poll_s)
    with path.open() as fh:
        while True:
            line = fh.readline()
            if line:
                sys.stdout.write(line)
                sys.stdout.flush()
            elif ended():
                sys.stdout.write(fh.read())  # what the job wrote between that read and its end
                sys.stdout.flush()
                return
            else:
                time.sleep(poll_s)


def _ended(job_id: Optional[str], check_s: float) -> Callable[[], bool]:
    """Whether `job_id` has ended, asked of the scheduler at most once per `check_s` (never: no job id)."""
    asked = [time.monotonic()]

    def ended() -> bool:
        if job_id is None or time.monotonic() - asked[0] < check_s:
            return False
        asked[0] = time.monotonic()
        try:
            rec = scheduler.query([job_id]).get(job_id)
        except RuntimeError:  # the controller did not answer: the log is followed on, asked again later
            return False
        return rec is None or rec.state not in scheduler.ACTIVE
    return ended


# tqdm's redraw: "desc:  55%|#####5    | 164/300 [00:01<00:01, 99.50it/s]", or "164it [00:01, ...]"
TQDM = re.compile(r"(?:(?P<desc>[^|\r\n]*?):\s*)?(?:\d+%\|[^|]*\|\s*)?"
                  r"(?P<n>\d+(?:\.\d+)?[kMGTPEZY]?)(?:/(?P<total>\d+(?:\.\d+)?[kMGTPEZY]?))?(?:it)?\s*\[\d")


def last_progress(log: Path, tail_bytes: int = 4096) -> str:
    """Last non-empty line of a log; tqdm redraws with \\r, so split on that too."""
    lines = _lines(log, tail_bytes)
    return lines[-1][:120] if lines else ""


def last_error(log: Path, tail_bytes: int = 4096) -> str:
    """The last line a failed task's own code wrote to its error log: the srun wrapper's account of
    what it did after the failure ('[hpc] srun exited 1: ...') and slurmstepd's notice of the step it
    ended ('slurmstepd: error: *** STEP 7.0 ... CANCELLED ***') come after it, and are shown only where
    the task wrote nothing else (a task that never ran)."""
    lines = _lines(log, tail_bytes)
    own = [ln for ln in lines if not ln.startswith((HPC_LINE, "slurmstepd: "))]
    return (own or lines or [""])[-1][:120]


HPC_LINE = "[hpc] "  # how hpc's own lines in a job's log start


def _lines(log: Path, tail_bytes: int) -> List[str]:
    text = _tail(log, tail_bytes)
    # submitit's own bookkeeping lines are not progress
    return [ln.strip() for ln in text.replace("\r", "\n").splitlines()
            if ln.strip() and not ln.startswith(("submitit ", "srun: "))]


def tqdm_progress(log: Path, tail_bytes: int = 4096) -> str:
    """tqdm's latest redraw in a log ("164/300", with the bar's description if it has one), or ""."""
    for segment in reversed(_tail(log, tail_bytes).replace("\r", "\n").splitlines()):
        found = TQDM.search(segment)
        if found:
            done = found["n"] + (f"/{found['total']}" if found["total"] else "")
            desc = (found["desc"] or "").strip()
            return f"{desc} {done}" if desc else done
    return ""


def _tail(log: Path, tail_bytes: int) -> str:
    if not log.exists():
        return ""
    with log.open("rb") as fh:
        fh.seek(max(0, log.stat().st_size - tail_bytes))
        return fh.read().decode(errors="replace")


def last_match(log: Path, pattern: "re.Pattern[bytes]", block: int = 1 << 20) -> Optional["re.Match[bytes]"]:
    """The last match of a one-line pattern in a file, read backwards a block at a time: a long
    log is read only as far back as its latest start."""
    if not log.exists():
        return None
    with log.open("rb") as fh:
        end, carry = fh.seek(0, 2), b""
        while end > 0:
            start = max(0, end - block)
            fh.seek(start)
            chunk = fh.read(end - start) + carry
            found = None
            for found in pattern.finditer(chunk):
                pass
            if found:
                return found
            carry, end = chunk[:chunk.find(b"\n") + 1 or len(chunk)], start  # a line the block boundary cut
    return None
