"""Cancel every queued or running job of a run, or of every point of a sweep.

    python -m hpc.cancel RUN_DIR [--stage S]
    python -m hpc.cancel SWEEP_DIR [--stage S]     # all points: their stages share array jobs

One scancel for all of the jobs (latest attempt of each task); done tasks keep their markers, so a
later resubmission into the same directory re-runs only what did not finish. A directory that is no
run or sweep, or a stage that none of its tasks has, is refused as hpc.status and hpc.logs refuse
it: "nothing to cancel" there would leave an operator believing the jobs were cancelled.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional, Sequence

from hpc.rundir import sweepdir
from hpc.rundir.run import RunDir, RunDirError
from hpc.slurm import scheduler


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpc.cancel", description="cancel a run's jobs")
    p.add_argument("run_dir", help="a run directory, or a sweep's")
    p.add_argument("--stage", help="only this stage")
    args = p.parse_args(argv)
    try:
        _check(args.run_dir, args.stage)
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


def _check(path: str, stage: Optional[str]) -> None:
    """Refuse a path that is neither a run nor a sweep, and a stage that none of its tasks has."""
    run = RunDir(path)
    sweep = sweepdir.is_sweep(path)
    if not sweep and not run.manifest_path.is_file():
        raise RunDirError(f"{run.manifest_path} not found; expected a run directory made by python -m hpc.submit "
                          "(or a sweep's). HINT: pass the 'run dir:' or 'sweep dir:' path printed at submission.")
    if stage is None:
        return
    runs: List[RunDir] = [run]
    if sweep:
        record = sweepdir.SweepDir(path)
        runs = [record.point(sig) for sig in record.record()["points"]]
    stages = sorted({t["stage"] for r in runs if r.manifest_path.is_file() for t in r.tasks()})
    if stage not in stages:
        raise RunDirError(f"stage {stage!r} not in {path}; expected one of {stages}. HINT: --stage NAME, "
                          "or no --stage for every stage.")


if __name__ == "__main__":
    sys.exit(main())
