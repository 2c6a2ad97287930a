"""A run's or a sweep's SLURM jobs, and one scancel for those still queued or running.

    python -m hpc.cancel RUN_DIR [--stage S]     # or hpc.Run(RUN_DIR).cancel()

A run's jobs are its manifest's, and those found by their token whose sbatch answer was lost
(hpc.monitor.lost); a sweep's are every point's, whose stages share array jobs.
"""
from __future__ import annotations

from typing import List, Optional

from hpc.monitor import lost
from hpc.rundir import sweepdir
from hpc.rundir.kind import check
from hpc.rundir.run import RunDir
from hpc.slurm import scheduler


def cancel(path: str, stage: Optional[str] = None) -> List[str]:
    """One scancel for the latest job of every task still queued or running (of a run, jobs found by
    their token included, or of every point of a sweep, whose stages share array jobs); returns the ids cancelled. Refuses what check()
    refuses: 'nothing to cancel' there would leave one believing the jobs were cancelled."""
    check(path, stage)
    slurm_ids = slurm_jobs(path, stage)
    if not slurm_ids:
        return []
    records = scheduler.query(slurm_ids)
    # a job submitted a moment ago may not be in the accounting yet: unknown counts as active
    active = [jid for jid in slurm_ids if jid not in records or records[jid].state in scheduler.ACTIVE]
    return scheduler.cancel(active)


def slurm_jobs(path: str, stage: Optional[str] = None) -> List[str]:
    """The SLURM job ids of a run (those found by their token included, whose sbatch answer was lost:
    hpc.monitor.lost) or of a sweep's points (hpc.rundir.sweepdir.slurm_jobs)."""
    if sweepdir.is_sweep(path):
        return sweepdir.slurm_jobs(path, stage)
    return lost.look(RunDir(path)).run.slurm_jobs(stage)
