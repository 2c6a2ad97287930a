"""Cancel every queued or running job of a run.

    python -m hpc.cancel RUN_DIR [--stage S]

One scancel for all of the run's jobs (latest attempt of each task); done tasks keep their markers,
so a later resubmission into RUN_DIR re-runs only what did not finish.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from hpc import scheduler
from hpc.rundir import RunDir, RunDirError


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpc.cancel", description="cancel a run's jobs")
    p.add_argument("run_dir")
    p.add_argument("--stage", help="only this stage")
    args = p.parse_args(argv)
    try:
        slurm_ids = RunDir(args.run_dir).slurm_jobs(args.stage)
    except RunDirError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not slurm_ids:
        print("no SLURM jobs recorded in this run (local jobs end with their submitting process)")
        return 0
    records = scheduler.query(slurm_ids)
    active = [jid for jid, r in records.items() if r.state in scheduler.ACTIVE]
    print(f"cancelled: {' '.join(scheduler.cancel(active)) or 'nothing (no job was queued or running)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
