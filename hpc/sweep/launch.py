"""A sweep's arrays submitted: one StageTask per (point, item), each point's manifest written once.

    python -m hpc.submit tiny --cluster slurm --sweep tiny.score=1,2 tiny.sleep_s=0,1   # hpc.sweep.submission calls it

Per array: the file naming each task's point (SweepDir.write_points) and the file of its tasks'
pickles (hpc.pipeline.arraytasks), one sbatch, then per point its jobs added to its manifest in
memory; each point's manifest is written once, at the end. A point's link to its stage's logs is
made by its task when it starts (hpc.pipeline.executor.StageTask), not here: 4 files per point.
"""
from __future__ import annotations

from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from hpc.pipeline import arraytasks, container
from hpc.pipeline import plan as hplan
from hpc.pipeline import submission as hsubmit
from hpc.rundir.run import RunDir, add_jobs
from hpc.rundir.sweepdir import SweepDir
from hpc.slurm.submitenv import submission_env
from hpc.sweep.points import Defs


def submit_arrays(plan: hplan.Plan, sweep: SweepDir, defs: Defs, setup: Sequence[str], code: Any = None,
                  manifests: Optional[Dict[str, Dict[str, Any]]] = None) -> Dict[str, List[str]]:
    """One submission (an array) per job of the plan. Every task runs `code`
    (hpc.rundir.snapshot.JobCode; None: the live tree) and its point's run id. `manifests`: each
    point's manifest as RunDir.begin() made it; the arrays' jobs are added in memory and each point's
    manifest is written once at the end, also when a later array is refused (it records those before)."""
    manifests = {} if manifests is None else manifests
    try:
        return _submit_arrays(plan, sweep, defs, setup, code, manifests)
    finally:
        for sig, data in manifests.items():
            sweep.point(sig).write_manifest(data)


def _submit_arrays(plan: hplan.Plan, sweep: SweepDir, defs: Defs, setup: Sequence[str], code: Any,
                   manifests: Dict[str, Dict[str, Any]]) -> Dict[str, List[str]]:
    # only when jobs are submitted: a dry run never loads the task and the executors
    from hpc.pipeline.executor import StageTask, drop_unexpanded_folder, make_executor, submit_array

    by_label: Dict[str, List[str]] = {}
    slurm = plan.kind == "slurm"
    for line in container.prepare(plan.jobs):  # the copy of hpc the containers' srun lines name
        print(line)
    with submission_env():
        for job in plan.jobs:
            sigs = list(dict.fromkeys(sig for sig, _ in job.items))
            for sig in sigs:  # a point with nothing new to start keeps its manifest as it is
                if sig not in manifests:
                    manifests[sig] = sweep.point(sig).manifest()
            tasks = [StageTask(str(sweep.path / sig), job.stage, job.target, item,
                               defs[sig][job.stage].items.index(item) if defs[sig][job.stage].items else None,
                               _needs(defs[sig], job.stage), code=code, run_id=manifests[sig].get("run_id", ""))
                     for sig, item in job.items]
            upstream = {sig: _upstream(job, manifests[sig], sweep.point(sig)) for sig in sigs} if slurm else {}
            per_item, each = job.item_dependency(by_label) if slurm else (None, [])
            executor = make_executor(plan.kind, job.folder, job.resources["max_timeouts"], job.python)
            packed = arraytasks.path_for(job.folder) if slurm and len(tasks) > 1 else None  # one file, not one each
            if plan.kind != "debug":
                dependency = ",".join(d for d in (afterany(upstream.values(), by_label), per_item) if d) or None
                where = sweep.write_points(job.stage, [sig for sig, _ in job.items], job.task_ids) if slurm else None
                executor.update_parameters(**job.executor_parameters(dependency, setup, where, packed))
            submitted = submit_array(executor, tasks, job.task_ids if slurm else (), packed)
            by_label[job.label] = [str(s.job_id) for s in submitted]
            mine: Dict[str, List[int]] = {sig: [] for sig in sigs}
            for n, (sig, _) in enumerate(job.items):
                mine[sig].append(n)
            for sig, own in mine.items():
                add_jobs(manifests[sig], job.stage, [(job.items[n][1], by_label[job.label][n]) for n in own],
                         plan.kind, upstream.get(sig, []), [each[n] for n in own] if each else (),
                         code.hash if code else None)
            if not slurm:  # no scheduler to order the stages: each array ends before the next starts
                hsubmit.wait_ok(submitted)
                drop_unexpanded_folder(job.folder)
    return by_label


def _upstream(job: hplan.JobSpec, manifest: Mapping[str, Any], run: RunDir) -> List[str]:
    """hpc.pipeline.submission.upstream for one point, from its manifest in memory (which holds this
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
