"""A run's task logs: which files, and following one as it grows.

    python -m hpc.logs RUN_DIR [--stage S] [--task I] [--rank R] [--err] [-f]

Logs are kept per stage, task and rank (RunDir.log_path); a log another node writes is waited for
by listing its directory, never by a lookup NFS would answer from its cache (hpc.fs.sharedfs).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import List, Optional

from hpc.fs.sharedfs import listed
from hpc.rundir.run import RunDir, RunDirError


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
    return [run.log_path(t["stage"], t["job_id"], rank, stream) for t in chosen]


def follow(path: Path, poll_s: float = 1.0) -> None:
    """Like tail -f: print what is appended until interrupted."""
    while path.name not in listed(path.parent):  # a listing, not a lookup NFS would answer from its cache
        time.sleep(poll_s)
    with path.open() as fh:
        while True:
            line = fh.readline()
            if line:
                sys.stdout.write(line)
                sys.stdout.flush()
            else:
                time.sleep(poll_s)
