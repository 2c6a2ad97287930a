"""Cancel every queued or running job of a run, or of every point of a sweep.

    python -m hpc.cancel RUN_DIR [--stage S]
    python -m hpc.cancel SWEEP_DIR [--stage S]     # all points: their stages share array jobs
    python -m hpc.cancel NAME:RUN_DIR              # a run on a named cluster, over ssh (hpc.remote.watch)

The API's Run.cancel (hpc.runs, hpc.monitor.runjobs) with its output printed: one scancel for all of the jobs (latest attempt of each task); done tasks keep their markers, so a
later resubmission into the same directory re-runs only what did not finish. A directory that is no
run or sweep, or a stage that none of its tasks has, is refused as hpc.status and hpc.logs refuse
it: "nothing to cancel" there would leave an operator believing the jobs were cancelled.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from hpc.monitor import runjobs
from hpc.remote import watch
from hpc.rundir.kind import check
from hpc.rundir.run import RunDirError


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpc.cancel", description="cancel a run's jobs")
    p.add_argument("run_dir", help="a run directory, or a sweep's")
    p.add_argument("--stage", help="only this stage")
    args = p.parse_args(argv)
    remote = watch.forward("hpc.cancel", sys.argv[1:] if argv is None else argv, args.run_dir)  # NAME:RUN_DIR
    if remote is not None:
        return remote
    try:
        check(args.run_dir, args.stage)
        if not runjobs.slurm_jobs(args.run_dir, args.stage):
            print("no SLURM jobs recorded in this run (local jobs end with their submitting process)")
            return 0
        cancelled = runjobs.cancel(args.run_dir, args.stage)  # hpc.Run(...).cancel(), the API's
    except RunDirError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"cancelled: {' '.join(cancelled) or 'nothing (no job was queued or running)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
