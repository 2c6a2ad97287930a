"""Show the logs of a run's tasks.

    python -m hpc.logs RUN_DIR [--stage features] [--task 2] [--rank 0] [--err] [-f]

Logs are submitit's per-rank files under <run>/<stage>/logs/<jobid>/; the manifest says which job
ran each task (the newest attempt).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

from hpc.rundir.run import RunDir, RunDirError
from hpc.fs.sharedfs import listed


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


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpc.logs", description="print a run's task logs")
    p.add_argument("run_dir")
    p.add_argument("--stage")
    p.add_argument("--task", help="array item (e.g. a level)")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--err", action="store_true", help="stderr instead of stdout")
    p.add_argument("-f", "--follow", action="store_true")
    args = p.parse_args(argv)
    try:
        paths = select(RunDir(args.run_dir), args.stage, args.task, args.rank, "err" if args.err else "out")
    except (ValueError, RunDirError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.follow:
        try:
            follow(paths[-1])
        except KeyboardInterrupt:
            return 0
    for path in paths:
        print(f"==> {path} <==")
        print(path.read_text(errors="replace") if path.exists() else "(no log yet)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
