"""Where a job's submitit files (logs, pickles) live under its stage's logs folder.

    <run>/<stage>/logs/<job>/<job>_<rank>_log.{out,err}                 a job: folder pattern logs/%j
    <run>/<stage>/logs/<array>/<array>_<task>_<rank>_log.{out,err}      an array's tasks: logs/%A

SLURM opens a task's logs in their folder and does not create it: a task whose folder is missing
when it starts fails at once (state FAILED, exit code 0:53) without running. The folder can only be
made once sbatch has named the job, so it is made right after sbatch, as submitit does for each job
it submits. An array's tasks share their array's folder: one mkdir per array, not one per task,
which made a 1000-task array wait for a thousand metadata operations after the sbatch that may
already be starting its tasks, and cost most of a sweep's submission CPU per point. Runs submitted
before keep a folder per array task (<array>_<task>/), found where it exists.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Collection

__all__ = ["pattern", "expand", "folder"]

JOB, ARRAY = "%j", "%A"  # submitit's tags in a folder: the job's id, its array's id


def pattern(stage_logs: str, array: bool) -> str:
    """The submitit folder of a stage's job: one per job, or per array for the tasks of a SLURM
    array of several (SLURM's %A is only defined for an array's tasks)."""
    return f"{stage_logs}/{ARRAY if array else JOB}"


def expand(folder_pattern: str, job_id: str) -> str:
    """`folder_pattern` for job `job_id` ('12', or '12_3' for an array task), as submitit fills it in."""
    return folder_pattern.replace(JOB, job_id).replace(ARRAY, job_id.partition("_")[0])


def folder(logs: str | os.PathLike, job_id: str, names: Collection[str] | None = None) -> Path:
    """The folder of job `job_id`'s files under a stage's `logs`: an array task's is its array's,
    unless the task has one of its own (a run submitted before arrays shared one). `names`: the
    listing of `logs`, when the caller has it (one listing for many tasks, not a lookup each)."""
    logs = Path(logs)
    array, sep, _ = job_id.partition("_")
    if sep and not (job_id in names if names is not None else (logs / job_id).is_dir()):
        return logs / array
    return logs / job_id
