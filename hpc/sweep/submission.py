"""Sweeps as array jobs: every point of a grid is a run, and each stage is one array job across the points.

    python -m hpc.submit tiny --cluster slurm --sweep tiny.score=1,2 tiny.sleep_s=0,1 [--run-dir SWEEP]
    python -m hpc.submit tiny --run-dir SWEEP        # again: the recorded grid; done points are skipped

A point is a run directory <sweep>/<signature>/ (hpc.sweep.grid names it, hpc.rundir.sweepdir lays it out) with
its own config.yaml, manifest and done markers, so whatever reads a run reads a point. The planner
(hpc.pipeline.plan) is given one pipeline whose stage items are (signature, item) pairs: what is done or
queued is skipped per point, MaxArraySize splits an array, and a per-item stage (aftercorr) lines
up with its upstream array across points as it does within a run. Each array task carries its
point's run directory and item (hpc.pipeline.executor.StageTask), so it reads its point's config and writes
into its point's directories.

Each point's config.yaml is written once before any task is submitted (hpc.sweep.points), its manifest
once after the last array; the plan reads each manifest once (RunDir.pin). Each array's batch script
names a file of its tasks' points (SweepDir.write_points): hpc.afterstep finds a point in one read.

A stage that waits on one stage of one task per point waits point by point: each of its tasks
sits at the task id of its point's upstream task and waits for that task only (aftercorr), so one
slow, failed or requeued point holds back no other point's next stage (a point with several such
tasks puts them in as many arrays, hpc.pipeline.arrays). Any other stage's array waits for the whole
previous arrays to end (afterany). Each task also checks that its own point's previous stages
finished (their done markers) before it runs. The points share each stage's resources (one array
job), so stages.*, cluster.* and run.* are not swept; key=value before --sweep applies to every point.
A packed stage (stages.X.pack, `run`'s --pack) runs k points per array task side by side, each as its own
step in its own point's run directory (hpc.pipeline.packrun; the task's SweepBook.tasks are grouped).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from hpc.config import layers
from hpc.config import schema as hconfig
from hpc.container import spec
from hpc.fs import atomic
from hpc.monitor import lost, status
from hpc.pipeline import arrays
from hpc.pipeline import plan as hplan
from hpc.pipeline import submission as hsubmit
from hpc.pipeline.request import Request, Submitted
from hpc.rundir.codeversion import code_version
from hpc.rundir.run import RunDir, RunDirError
from hpc.rundir.sweepdir import SweepDir
from hpc.slurm import gres, limits, scheduler
from hpc.sweep import grid as hgrid
from hpc.sweep import launch
from hpc.sweep import points as sweepconfig
from hpc.sweep.points import Defs


def start(req: Request) -> Submitted:
    """Plan and submit every point of the grid; returns the sweep dir and the arrays submitted now
    (none for a dry run or when all is done or queued). A dry run prints the plan and changes nothing."""
    req, recorded = _recorded(req)
    pipe, base, run, kind, notes = hsubmit.build(req, view=False)
    if kind == "here":  # hpc.here runs one run's stages, not a grid of arrays
        raise hconfig.ConfigError("a sweep does not run with --cluster here; expected slurm, local or debug. "
                                  "HINT: run each point on its own (--cluster here key=value), or sbatch the sweep.")
    sweep = SweepDir(run.path)
    grid = _grid(req, recorded, base, pipe.name)
    points = hgrid.points(grid)
    defs = sweepconfig.resolve(base, points, pipe)
    if req.dry_run:
        plan, states, _ = _plan(pipe, base, defs, sweep, kind, None)
        print(summary(plan, points, states, sweep.removed(points) + [f"note: {n}" for n in notes]))
        for job in plan.jobs:
            print(f"\n# ---- sbatch script: stage {job.label} ----")
            print(job.sbatch_text(setup=list(base.cluster.setup), how="afterany"))
        return Submitted(sweep.path, str(kind), {})
    # one syncfs makes every point's files durable at the end, instead of two fsyncs per file
    with RunDir(sweep.path).submission_lock(say=print), atomic.batched(sweep.path):
        for line in lost.settle_sweep(sweep.path, sweep.point) if kind == "slurm" else ():  # lost sbatch answers
            print(line)
        max_size = scheduler.max_array_size() if kind == "slurm" else None
        plan, states, never = _plan(pipe, base, defs, sweep, kind, max_size)
        scheduler.cancel(never)
        print(summary(plan, points, states, sweep.removed(points) + [f"note: {n}" for n in notes]))
        sweep.save(pipe.name, grid, latest([*req.overrides, *req.flags()]), req.profile, points)
        if not plan.jobs:
            print(f"nothing to submit: every task of every point of {sweep.path} is done or queued")
            return Submitted(sweep.path, str(kind), {})
        if kind == "slurm":  # the site's submit limit takes the whole sweep, or nothing is submitted
            limits.refuse_past_limit([len(job.units) for job in plan.jobs], [job.resources for job in plan.jobs])
        # pipeline_arg: how a job names the pipeline to resubmit its point (hpc.afterstep, as hpc.submit)
        module_file = hsubmit.user_module_file(req.pipeline)
        code = {**code_version(module_file), "pipeline_arg": req.pipeline}
        # one code snapshot for all points, in the store of the sweep dir's root; each point its own run id
        snap = hsubmit.take_snapshot(base, sweep.path, kind, code)
        code["snapshot"] = snap and snap.record()
        now = {sig for job in plan.jobs for sig, _ in job.items}
        texts = sweepconfig.texts(base, [p for p in points if p.signature in now], pipe.settle)
        manifests = {}
        for sig, text in texts.items():  # config.yaml before any task can start; the manifest once, at the end
            point = sweep.point(sig)
            if not states[sig][3]:  # a new point: its folder first, or the write's first open fails
                point = RunDir.new_at(point.path)
                with contextlib.suppress(FileExistsError):
                    os.mkdir(point.path)
            atomic.write_text(point.config_path, text)
            manifests[sig] = point.begin(pipe.name, kind, code)
        ids = launch.submit_arrays(plan, sweep, defs, list(base.cluster.setup),
                            hsubmit.job_code(snap, req.pipeline, module_file), manifests)
    print(f"sweep dir: {sweep.path}")
    for label, jids in ids.items():
        print(f"  {label}: {jids[0].split('_')[0]} ({len(jids)} task(s))")
    return Submitted(sweep.path, str(kind), {label: list(jids) for label, jids in ids.items()})


def _recorded(req: Request) -> Tuple[Request, Dict[str, Any]]:
    """A resubmission into a sweep dir: the request with its recorded overrides and profile under
    those given now, and the record."""
    if not req.run_dir:
        return req, {}
    sweep, run = SweepDir(req.run_dir), RunDir(req.run_dir)
    if not sweep.record_path.exists():
        if run.manifest_path.exists():
            raise RunDirError(f"--run-dir {run.path} is a run, not a sweep (no sweep.json); expected a new "
                              "directory or a sweep's. HINT: pass --run-dir a new path for the sweep.")
        return req, {}
    recorded = sweep.record()
    if recorded.get("pipeline") not in (None, hplan.get_pipeline(req.pipeline).name):
        raise RunDirError(f"sweep {sweep.path} is of pipeline {recorded['pipeline']!r}, not {req.pipeline!r}; "
                          f"expected the same pipeline. HINT: python -m hpc.submit {recorded['pipeline']} "
                          f"--run-dir {sweep.path}")
    return dataclasses.replace(req, overrides=(*recorded.get("overrides", []), *req.overrides),
                               profile=req.profile or recorded.get("profile")), recorded


def latest(overrides: Sequence[str]) -> List[str]:
    """key=value overrides with only the last value of each key, in the order of those last values."""
    last = {o.partition("=")[0]: i for i, o in enumerate(overrides)}
    return [o for i, o in enumerate(overrides) if last[o.partition("=")[0]] == i]


def _grid(req: Request, recorded: Mapping[str, Any], base: Any, pipeline: str) -> Dict[str, List[Any]]:
    """The grid from --sweep and --sweep-file, else the one the sweep dir recorded; keys checked."""
    grids = ([hgrid.parse_tokens(list(req.sweep))] if req.sweep is not None else []) + \
        ([hgrid.read_file(req.sweep_file)] if req.sweep_file else [])
    grid = hgrid.merge(*grids) if grids else dict(recorded["grid"])
    hgrid.check_keys(grid, hgrid.leaf_keys(hconfig.to_dict(base)), pipeline, lambda key: layers.accepts(base, key))
    for key, values in grid.items():
        bad = [v for v in values if hconfig.has_control(str(v))]
        if bad:
            raise hgrid.SweepError(f"--sweep {key}: value {bad[0]!r} contains a control character; expected "
                                   "printable text. HINT: write each value on one line, without escapes.")
    return grid


def merged_stages(defs: Defs) -> List[hplan.StageDef]:
    """One StageDef per stage name whose items are (signature, item) over every point that runs it."""
    names = list(dict.fromkeys(name for stages in defs.values() for name in stages))
    out = []
    for name in names:
        own = [(sig, stages[name]) for sig, stages in defs.items() if name in stages]
        first = own[0][1]
        other = next((sig for sig, s in own if s.target != first.target), None)
        if other:
            raise hgrid.SweepError(f"stage {name} runs {first.target} in point {own[0][0]} but "
                                   f"{defs[other][name].target} in point {other}; expected one target per "
                                   "stage (one array job). HINT: sweep a key that leaves the stages' targets alone.")
        items = tuple((sig, i) for sig, s in own if not s.skip for i in (s.items or (None,)))
        after, per_item, of = first.after, first.per_item_after, None
        if _per_point(defs, [sig for sig, s in own if not s.skip], first):
            after, per_item, of = (), first.after[0], point_task
        out.append(hplan.StageDef(name, first.target, items=items, after=after, per_item_after=per_item,
                                  per_item_of=of, resources=first.resources, describe=first.describe,
                                  skip="" if items else first.skip or "no point runs it", batch=first.batch))
    return out


def point_task(item: Tuple[str, Any]) -> Tuple[str, None]:
    """The one task of its point that a task of a per-point stage waits for (_per_point)."""
    return item[0], None


def _per_point(defs: Defs, sigs: Sequence[str], stage: hplan.StageDef) -> bool:
    """Whether `stage` waits, in every point that runs it, on one stage that is one task of that
    point: then each task waits for its own point's task only (aftercorr), not for the whole
    array; otherwise the array waits for the previous arrays to end (afterany)."""
    if stage.per_item_after or len(stage.after) != 1:
        return False
    up = stage.after[0]
    return bool(sigs) and all(up in defs[sig] and not defs[sig][up].skip and not defs[sig][up].items
                              for sig in sigs)


def _plan(pipe: hplan.PipelineDef, base: Any, defs: Defs, sweep: SweepDir, kind: str,
          max_size: Any) -> Tuple[hplan.Plan, Dict[str, Tuple[int, int, int, bool]], List[str]]:
    """(the plan of the arrays, per point (done, queued, total tasks, submitted before), the jobs
    that can never start), from one scheduler call for all points."""
    # one listing of the sweep dir: a point without a directory has nothing done, queued or recorded
    known = set(os.listdir(sweep.path)) if sweep.path.is_dir() else set()
    runs = {sig: sweep.point(sig).pin() for sig in defs if sig in known}  # each manifest read once
    answer = hsubmit.confirmed(status.query_run(*runs.values())) if kind == "slurm" and runs else None
    finished: set = set()
    queued: Dict[Tuple[str, Any], str] = {}
    states, never = {}, []
    for sig, stages in defs.items():
        total = sum(len(s.items or (None,)) for s in stages.values() if not s.skip)
        run = runs.get(sig)
        if run is None:
            states[sig] = (0, 0, total, False)
            continue
        own = hplan.PipelineDef(pipe.name, pipe.schema, lambda _, sig=sig: list(defs[sig].values()))
        done, waiting, _ = hsubmit.current_state(own, base, run, kind, answer)
        finished |= {(stage, (sig, item)) for stage, item in done}
        queued.update({(stage, (sig, item)): jid for (stage, item), jid in waiting.items()})
        states[sig] = (len(done), len(waiting), total, bool(done or waiting or run.manifest()))
        never += [t["job_id"] for t in run.tasks() if answer and t["job_id"] in answer[1]]
    merged = merged_stages(defs)
    virtual = hplan.PipelineDef(pipe.name, pipe.schema, lambda cfg: merged, notes=pipe.notes)
    plan = hplan.make_plan(virtual, base, str(sweep.path), kind, frozenset(finished), queued, max_size,
                           gres.node_gpus if kind == "slurm" else None)
    # where the containers' ranks import hpc from, as a single run's plan says (hpc.pipeline.submission)
    plan = dataclasses.replace(plan, notes=plan.notes + tuple(spec.notes(plan.jobs, plan.kind, base)))
    return plan, states, sorted(never)


def summary(plan: hplan.Plan, points: Sequence[hgrid.Point], states: Mapping[str, Tuple[int, int, int, bool]],
            extra: Sequence[str]) -> str:
    """The arrays, then one line per point: new, done, queued, or what it resumes."""
    lines = [f"sweep: pipeline {plan.pipeline}, {len(points)} point(s) -> {plan.run_dir} (executor: {plan.kind})"]
    for job in plan.jobs:
        owners = len({sig for sig, _ in job.items})
        worlds = "-".join(map(str, sorted(set(job.worlds or (job.ranks,)))))
        after = [f"{', '.join(job.after)} (afterany; each task first checks its own point's)"] * bool(job.after)
        if job.item_after and job.waits:
            after.append(f"its own point's {job.item_after} task, task by task (aftercorr)")
        elif job.item_after and plan.kind != "slurm":  # no scheduler: the arrays run one after another
            after.append(f"{job.item_after} (submitted when it has ended)")
        ids = f" at task ids {arrays.spec(job.task_ids).partition('%')[0]}" if job.task_ids else ""
        lines.append(f"  stage {job.label}: one array of {len(job.units)} task(s){ids} over {owners} point(s), "
                     f"{worlds} rank(s) per {'point' if job.groups else 'task'}" + (f", after {', '.join(after)}" if after else ""))
        lines += [f"    array task {t}: points {' '.join(sig if i is None else f'{sig}[{i}]' for sig, i in group)} "
                  f"side by side (stages.{job.section}.pack)" for t, group in zip(job.task_ids or range(len(job.groups)), job.groups)]
    todo = {sig: 0 for sig in states}
    for job in plan.jobs:
        for sig, _ in job.items:
            todo[sig] += 1
    for p in points:
        done, queued, total, known = states[p.signature]
        now = todo[p.signature]
        if done == total:
            what = "done"
        elif now:
            what = f"{'resume' if known else 'new'}: {now} of {total} task(s) to submit, {done} done, {queued} queued"
        else:
            what = f"{done} done, {queued} queued"
        lines.append(f"  point {p.signature} {p.describe()}: {what}")
    lines += [f"  note: {n}" for n in plan.notes] + [f"  {line}" for line in extra]
    return "\n".join(lines)
