"""Cancel every queued or running job of a run, or of every point of a sweep.

    python -m hpc.cancel RUN_DIR [--stage S]
    python -m hpc.cancel SWEEP_DIR [--stage S]     # all points: their stages share array jobs

One scancel for all of the jobs (latest attempt of each task); done tasks keep their markers, so a
later resubmission into the same directory re-runs only what did not finish.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from hpc.rundir import sweepdir
from hpc.rundir.run import RunDirError
from hpc.slurm import scheduler


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpc.cancel", description="cancel a run's jobs")
    p.add_argument("run_dir", help="a run directory, or a sweep's")
    p.add_argument("--stage", help="only this stage")
    args = p.parse_args(argv)
    try:
        slurm_ids = sweepdir.slurm_jobs(args.run_dir, args.stage)
    except RunDirError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not slurm_ids:
        print("no SLURM jobs recorded in this run (local jobs end with their submitting process)")
        return 0
    records = scheduler.query(slurm_ids)
    # a job submitted a moment ago may not be in the accounting yet: unknown counts as active
    active = [jid for jid in slurm_ids if jid not in records or records[jid].state in scheduler.ACTIVE]
    print(f"cancelled: {' '.join(scheduler.cancel(active)) or 'nothing (no job was queued or running)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
