"""The newest runs under a runs root, one line each: what python -m hpc.status lists per named cluster.

    python -m hpc.remote.recent ~/hpc-runs 5

Run by the cluster's interpreter on its login node (hpc.remote.watch.recent): each run directory's
path, its pipeline and its tasks by state (one scheduler call per run); a sweep directory as a sweep.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Sequence

from hpc.monitor import status, table
from hpc.rundir import sweepdir
from hpc.rundir.run import RunDir, RunDirError


def newest(root: Path, n: int) -> List[Path]:
    """The `n` newest run or sweep directories directly under `root`, newest first."""
    try:
        found = [p for p in root.iterdir() if not p.name.startswith(".") and p.is_dir()
                 and (RunDir(p).manifest_path.is_file() or sweepdir.is_sweep(str(p)))]
    except FileNotFoundError:
        return []
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)[:n]


def line(path: Path) -> str:
    if sweepdir.is_sweep(str(path)):
        return f"{path}  sweep of {len(sweepdir.SweepDir(path).record()['points'])} point(s)"
    run = RunDir(path).pin()
    try:
        states = [r.state for r in status.collect(run)]
    except (RuntimeError, ValueError) as err:  # the scheduler, a damaged file
        return f"{path}  {run.manifest().get('pipeline', '?')}  error: {err}"
    return f"{path}  {run.manifest().get('pipeline', '?')}  {table.by_state(states)}"


def main(argv: Sequence[str]) -> int:
    root = Path(os.path.expanduser(argv[0]))
    for path in newest(root, int(argv[1]) if len(argv) > 1 else 5):
        try:
            print(line(path), flush=True)
        except (RunDirError, OSError) as err:
            print(f"{path}  error: {err}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
