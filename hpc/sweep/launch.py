"""A sweep's arrays on the one launch path (hpc.pipeline.launcher): one StageTask per (point, item),
each point's manifest written once.

    python -m hpc.submit tiny --cluster slurm --sweep tiny.score=1,2 tiny.sleep_s=0,1   # hpc.sweep.submission calls it

Per array: the file naming each task's point (SweepDir.write_points) and the file of its tasks'
pickles (hpc.pipeline.arraytasks), one sbatch, then per point its jobs added to its manifest in
memory; each point's manifest is written once, at the end. Where nothing orders the stages (the
local and debug executors) each array is waited for before the next starts: there a point's manifest
is also written as each array starts, so that hpc.status shows its tasks running meanwhile. A point's
link to its stage's logs is made by its task when it starts (hpc.pipeline.executor.StageTask), not
here: 4 files per point.
A failed array does not stop the later ones on the local executor: each task checks its own point's.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from hpc.pipeline import launcher
from hpc.pipeline import plan as hplan
from hpc.rundir.run import RunDir, add_jobs
from hpc.rundir.sweepdir import SweepDir
from hpc.sweep.points import Defs


def submit_arrays(plan: hplan.Plan, sweep: SweepDir, defs: Defs, setup: Sequence[str], code: Any = None,
                  manifests: Optional[Dict[str, Dict[str, Any]]] = None) -> Dict[str, List[str]]:
    """One submission (an array) per job of the plan; returns JobSpec.label -> job ids. Every task
    runs `code` (hpc.rundir.snapshot.JobCode; None: the live tree) and its point's run id. `manifests`:
    each point's manifest as RunDir.begin() made it; the arrays' jobs are added in memory and each point's
    manifest is written once at the end, also when a later array is refused (it records those before)."""
    book = SweepBook(sweep, defs, code, {} if manifests is None else manifests)
    return launcher.launch(plan, book, launcher.Submitit(plan.kind, setup))


class SweepBook(launcher.Book):
    """A sweep's arrays: a task per (point, item) that checks its own point's upstream tasks, afterany
    on the upstream arrays, a points file per array, each point's manifest in memory."""

    stops = False  # a point's failure is its own: the other points' tasks go on

    def __init__(self, sweep: SweepDir, defs: Defs, code: Any, manifests: Dict[str, Dict[str, Any]]):
        self.sweep, self.defs, self.code, self.manifests = sweep, defs, code, manifests
        self.where: Path = sweep.path

    def tasks(self, job: hplan.JobSpec) -> List[Any]:
        from hpc.pipeline.executor import StageTask  # only once jobs start: a dry run never loads the task

        for sig in dict.fromkeys(sig for sig, _ in job.items):  # a point with nothing new keeps its manifest
            if sig not in self.manifests:
                self.manifests[sig] = self.sweep.point(sig).manifest()
        defs = self.defs
        tasks = [StageTask(str(self.sweep.path / sig), job.stage, job.target, item,
                           defs[sig][job.stage].items.index(item) if defs[sig][job.stage].items else None,
                           _needs(defs[sig], job.stage), code=self.code, run_id=self.manifests[sig].get("run_id", ""))
                 for sig, item in job.items]
        if not job.groups:
            return tasks
        from hpc.pipeline import packrun  # a packed stage's only: its points side by side in one job

        return packrun.grouped(job, tasks)

    def upstream(self, job: hplan.JobSpec, ids: Dict[str, List[str]]) -> Tuple[Optional[str], Dict[str, List[str]]]:
        ups = {sig: _upstream(job, self.manifests[sig], self.sweep.point(sig))
               for sig in dict.fromkeys(sig for sig, _ in job.items)}
        return afterany(ups.values(), ids), ups

    def points(self, job: hplan.JobSpec) -> Optional[str]:
        if job.groups:  # a packed array's task holds several points: its line names them all
            return self.sweep.write_points(job.stage, [",".join(dict.fromkeys(s for s, _ in g)) for g in job.groups],
                                           job.task_ids)
        return self.sweep.write_points(job.stage, [sig for sig, _ in job.items], job.task_ids)

    def record(self, job: hplan.JobSpec, started: launcher.Started, order: launcher.Order, kind: str) -> None:
        mine: Dict[str, List[Tuple[int, str]]] = {}
        for n, jid in started:
            mine.setdefault(job.items[n][0], []).append((n, jid))
        ups = order.after or {}
        for sig, own in mine.items():
            add_jobs(self.manifests[sig], job.stage, [(job.items[n][1], jid) for n, jid in own], kind,
                     ups.get(sig, []), [order.each[n] for n, _ in own] if order.each else (),
                     self.code.hash if self.code else None)
            if kind != "slurm":  # the backend waits for these tasks to end: their points show them running
                self.sweep.point(sig).write_manifest(self.manifests[sig])

    def close(self) -> None:
        for sig, data in self.manifests.items():
            self.sweep.point(sig).write_manifest(data)


def _upstream(job: hplan.JobSpec, manifest: Mapping[str, Any], run: RunDir) -> List[str]:
    """hpc.pipeline.runbook.upstream for one point, from its manifest in memory (which holds this
    submission's earlier arrays): the latest job of each task of `job.after` not done yet."""
    tasks = manifest.get("tasks", {}).values()
    return sorted({t["job_id"] for t in tasks if t["stage"] in job.after and not run.is_done(t["stage"], t["item"])})


def _needs(stages: Mapping[str, hplan.StageDef], stage: str) -> List[Tuple[str, Any]]:
    """The tasks of this point that must be done before its `stage` runs: every task of its `after` stages."""
    return [(up, i) for up in stages[stage].after if not stages[up].skip for i in (stages[up].items or (None,))]


def afterany(upstream: Any, arrays_now: Mapping[str, Sequence[str]]) -> Any:
    """'afterany:12:13_4' for the job ids the points wait for; an array submitted now whose tasks are
    all among them is named whole ('12'), which keeps the option short for any number of points."""
    ids: FrozenSet[str] = frozenset(j for ups in upstream for j in ups)
    for jids in arrays_now.values():
        if len(jids) > 1 and set(jids) <= ids:
            ids = (ids - set(jids)) | {jids[0].split("_")[0]}
    return f"afterany:{':'.join(sorted(ids))}" if ids else None
