"""Show the logs of a run's tasks.

    python -m hpc.logs RUN_DIR [--stage features] [--task 2] [--rank 0] [--err] [-f]
    python -m hpc.logs NAME:RUN_DIR -f          # a run on a named cluster: the same, over ssh

Logs are submitit's per-rank files under <run>/<stage>/logs/<jobid>/; the manifest says which job
ran each task (the newest attempt). -f follows the newest chosen log until its SLURM job ends (a
requeued job goes on in the same file). hpc.Run(RUN_DIR).logs(...) is the same from Python.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from hpc.monitor.logs import follow
from hpc.remote import watch
from hpc.rundir.run import RunDir, RunDirError
from hpc.runs import Run


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpc.logs", description="print a run's task logs")
    p.add_argument("run_dir")
    p.add_argument("--stage")
    p.add_argument("--task", help="array item (e.g. a level)")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--err", action="store_true", help="stderr instead of stdout")
    p.add_argument("-f", "--follow", action="store_true")
    args = p.parse_args(argv)
    remote = watch.forward("hpc.logs", sys.argv[1:] if argv is None else argv, args.run_dir)  # NAME:RUN_DIR
    if remote is not None:
        return remote
    try:
        paths = Run(args.run_dir).log_paths(args.stage, args.task, args.rank, args.err)
    except (ValueError, RunDirError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.follow:
        try:
            # "<job id>_<rank>_log.out", a packed item's "<job id>.item-<item>_<rank>_log.out": followed until that job ends
            job = paths[-1].name.rsplit("_", 2)[0].partition(".item-")[0]
            follow(paths[-1], job_id=job if job in RunDir(args.run_dir).slurm_jobs() else None)
        except KeyboardInterrupt:
            return 0
    for path in paths:
        print(f"==> {path} <==")
        print(path.read_text(errors="replace") if path.exists() else "(no log yet)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
