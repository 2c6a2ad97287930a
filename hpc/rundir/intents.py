"""Submissions announced before their sbatch runs: the token each carries and the tasks it stands for.

    python -c "from hpc.rundir import intents; print(intents.pending('runs/x'))"

A busy controller can queue a job and lose sbatch's answer, and the look-up by token that follows
(hpc.pipeline.submitonce) can fail too; the submitting process can be killed between sbatch and
the manifest write. So before each sbatch of a run (or sweep) the tasks it submits are written down
under its token, and the file is removed once their job ids are in the manifest. One left behind
is a submission whose outcome hpc did not see: python -m hpc.status looks its token up (one squeue
call, hpc.monitor.lost) and shows the job it finds; a resubmission into the run adopts that job
before it plans, so the work is never queued twice.

Layout::

    <run>/.sbatch/<token>.json   {"token", "stage", "items", "ids", "after", "each", "code", "logs",
                                  "pickle", "time", "at"}

`ids`: per item, what follows the job id sbatch prints ("_3": array task 3; "": the job itself);
`after` and `each`: what the manifest records as waited for (hpc.rundir.run.add_jobs).

What the submission would have done once sbatch answered, a job found later needs done for it
(complete): SLURM opens a task's logs in a folder it does not create (hpc.rundir.logdirs), and
submitit moves a job's pickle to where the job reads it (it waits 60 s for it, then fails).
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from hpc.fs import atomic
from hpc.fs.sharedfs import listed
from hpc.rundir import logdirs

DIR = ".sbatch"


def announce(where: Path, token: str, stage: str, items: Sequence[Any], ids: Sequence[str],
             after: Any = (), each: Sequence[Sequence[str]] = (), code: Any = None, logs: str = "",
             pickle: Optional[Tuple[str, str]] = None) -> None:
    """Write down, durably, that the sbatch carrying `token` submits `items` of `stage`; `logs`: its
    submitit folder (%j, %A for its id), `pickle`: a job's own (where it is, where the job reads it)."""
    folder = Path(where) / DIR
    folder.mkdir(parents=True, exist_ok=True)
    entry = {"token": token, "stage": stage, "items": list(items), "ids": list(ids), "after": after,
             "each": [list(e) for e in each], "code": code, "logs": logs, "pickle": pickle,
             "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "at": time.time()}
    atomic.write_text(folder / f"{token}.json", json.dumps(entry, default=str))


def pending(where: Path) -> List[Dict[str, Any]]:
    """The announced submissions not yet settled, oldest first (one listing of the folder; none: [])."""
    folder = Path(where) / DIR
    out = []
    for name in sorted(listed(folder)):
        if not name.endswith(".json") or name.startswith("."):  # an atomic write's temporary file
            continue
        try:
            entry = json.loads((folder / name).read_bytes())
        except (OSError, ValueError):
            continue  # removed meanwhile by the submission that settled it
        if isinstance(entry, dict) and {"token", "stage", "items", "ids"} <= set(entry):
            out.append(entry)
    return sorted(out, key=age_s, reverse=True)


def drop(where: Path, tokens: Iterable[str]) -> None:
    """Forget the announcements of `tokens` (their jobs are recorded, or were never queued)."""
    for token in tokens:
        atomic.unlink_quietly(Path(where) / DIR / f"{token}.json")


def job_ids(entry: Dict[str, Any], first: str) -> List[str]:
    """Each item's job id, given the id sbatch printed (or squeue's %F) for the announced submission."""
    return [first + suffix for suffix in entry["ids"]]


def id_suffixes(task_ids: Sequence[int], array: bool) -> List[str]:
    """`ids` of an announcement: "_<task>" for each task of an array, "" for a job of its own."""
    return [f"_{t}" for t in task_ids] if array else [""]



def age_s(entry: Dict[str, Any]) -> float:
    """Seconds since the announcement was written (its `at`, a time.time())."""
    at = entry.get("at")
    return max(0.0, time.time() - at) if isinstance(at, (int, float)) else float("inf")


def complete(entry: Dict[str, Any], first: str, move: bool = True) -> None:
    """For the job found for `entry` (sbatch printed `first`): make its log folders and move its
    pickle into place, as the submission would have; what is done already is left as it is.
    `move=False` (a status, which may run while that very submission goes on): copy the pickle, so
    that submitit's own move after sbatch answers still finds it."""
    ids = job_ids(entry, first)
    try:
        for path in dict.fromkeys(logdirs.expand(entry["logs"], jid) for jid in ids) if entry.get("logs") else ():
            os.makedirs(path, exist_ok=True)
        if entry.get("pickle") and len(ids) == 1:
            written, reads = entry["pickle"]
            target = reads.replace(logdirs.JOB, ids[0])
            with contextlib.suppress(FileNotFoundError):  # moved already (a resubmission, submitit)
                if move:
                    os.replace(written, target)
                elif not os.path.exists(target):
                    atomic.write_bytes(target, Path(written).read_bytes())
    except OSError:  # another user's run, read-only to this one: status still shows the job
        pass
