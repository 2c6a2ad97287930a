"""A run's Book for the launch path (hpc.pipeline.launcher): what each job of a run's plan runs,
what it waits for, and where its ids are recorded.

    ids = launcher.launch(plan, RunBook(RunDir(path), code, run_id), backend)   # via submission.submit_plan

One StageTask per item (a packed stage's items grouped, hpc.pipeline.packrun), afterok on the
upstream stages' tasks (submitted now, or still queued from an earlier submission: each array task
by its own id), and the ids written to the run's manifest as each job starts (RunDir.record_all).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpc.pipeline import launcher
from hpc.pipeline import plan as hplan
from hpc.rundir import snapshot
from hpc.rundir.run import RunDir


class RunBook(launcher.Book):
    """A run's jobs: one StageTask per item, afterok on the upstream stages' tasks, and the ids
    recorded in the manifest as each job starts (RunDir.record_all)."""

    def __init__(self, run: RunDir, code: Optional[snapshot.JobCode] = None, run_id: str = ""):
        self.run, self.code, self.run_id, self.where = run, code, run_id, run.path
        self.ids: Dict[str, List[str]] = {}  # stage -> the job ids started now

    def tasks(self, job: hplan.JobSpec) -> List[Any]:
        # only once jobs start: a dry run never loads the task
        from hpc.pipeline.executor import StageTask

        tasks = [StageTask(str(self.run.path), job.stage, job.target, item, index, code=self.code, run_id=self.run_id)
                 for item, index in zip(job.items, job.indices)]
        if not job.groups:
            return tasks
        from hpc.pipeline import packrun  # a packed stage's only: hpc.recovery's modules come with it

        return packrun.grouped(job, tasks)

    def upstream(self, job: hplan.JobSpec, ids: Dict[str, List[str]]) -> Tuple[Optional[str], List[str]]:
        waits = upstream(job, self.ids, self.run)
        return afterok(waits), waits

    def record(self, job: hplan.JobSpec, started: launcher.Started, order: launcher.Order, kind: str) -> None:
        each = [order.each[n] for n, _ in started] if order.each else ()
        self.run.record_all(job.stage, [(job.items[n], jid) for n, jid in started], kind, order.after, each,
                            self.code.hash if self.code else None)
        self.ids.setdefault(job.stage, []).extend(jid for _, jid in started)


def upstream(job: hplan.JobSpec, ids: Dict[str, List[str]], run: RunDir) -> List[str]:
    """Job ids of the stages `job` waits for: submitted now, and those of the same stages still
    queued or running from an earlier submission (after a partial resubmission of an array stage,
    both). The manifest already holds this submission's ids as the tasks' latest jobs."""
    waiting: Dict[str, set] = {s: set(ids.get(s, [])) for s in job.after}
    for t in run.tasks():
        # a finished task needs no afterok (its job may be purged from SLURM already); every other
        # task not resubmitted now was found queued or running by current_state
        if t["stage"] in waiting and not run.is_done(t["stage"], t["item"]):
            waiting[t["stage"]].add(t["job_id"])
    return sorted(i for s in job.after for i in waiting[s])


def afterok(job_ids: Sequence[str]) -> Optional[str]:
    """sbatch --dependency value naming each array task ('12_3'), not the array ('12'): after a
    partial resubmission the old array also holds the failed task, and afterok on the whole array
    would never be satisfied."""
    ids = sorted(set(job_ids), key=lambda i: [int(p) if p.isdigit() else p for p in i.split("_")])
    return f"afterok:{':'.join(ids)}" if ids else None
