"""The submission engine: a Request -> config, plan, code snapshot, jobs through submitit.

    from hpc.pipeline.submission import Request, submit
    submit(Request("langsplat", levels=(0, 1, 2), cluster="local", wait=True))   # python -m hpc.submit ...

Request (hpc.pipeline.request) holds what `python -m hpc.submit` reads, typed; the command (hpc.submit)
and sweeps (hpc.sweep.submission, which does the same for every point) both call this module. The
jobs start on the one launch path (hpc.pipeline.launcher) with a run's Book (hpc.pipeline.runbook:
afterok on the upstream tasks, the manifest written as each job starts), running the code snapshot
that hpc.pipeline.jobcode takes, and the Backend of the executor kind: submitit's, or one the
caller passes (hpc.api: `--cluster here`'s).
Returns as soon as SLURM has the jobs (afterok chains the stages; nothing here stays alive),
except with the local executor, which has no dependencies and so runs the stages in order.
One submission at a time per run dir (a lock held from reading its state to the last manifest write);
a dry run reads the state and changes nothing. Variables of an enclosing allocation never reach the jobs.
Errors are hpc.config.checks.ConfigError or RuntimeError (RunDirError, SLURM's refusals), with a HINT.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from hpc.config import schema as hconfig
from hpc.container import spec
from hpc.pipeline import launcher
from hpc.pipeline import plan as hplan
from hpc.pipeline.jobcode import job_code, snapshot_note, take_snapshot, user_module_file
from hpc.pipeline.request import Request, Submitted
from hpc.pipeline.runbook import RunBook
from hpc.rundir import intents, snapshot
from hpc.rundir.codeversion import code_version
from hpc.rundir.run import RunDir
from hpc.slurm import gres, limits, scheduler

MakeBackend = Callable[[str, Sequence[str]], launcher.Backend]  # (executor kind, cluster.setup) -> Backend


def build(req: Request, view: bool = True) -> Tuple[hplan.PipelineDef, Any, RunDir, str, List[str]]:
    """Config, run directory, executor kind and plan notes of a request; validates everything.
    A dry run reads the config cache but writes nothing, there or anywhere else.
    The config is read-only (hpc.config.view); `view=False`: a DictConfig (hpc.config.schema.load)."""
    pipe = hplan.get_pipeline(req.pipeline)
    run_dir = None
    if req.run_dir is not None:
        _check_run_dir(req.run_dir)
        run_dir = Path(req.run_dir)
    overrides = list(req.overrides) + req.flags()
    saved = run_dir / "config.yaml" if run_dir else None
    notes: List[str] = []
    cfg = hconfig.load(pipe.schema, req.pipeline, req.profile, overrides, saved, extra=pipe.templates,
                       notes=notes, view=view, settle=pipe.settle, keep=not req.dry_run)
    pipe.validate(cfg)
    kind = scheduler.detect(cfg.cluster.kind)
    if kind == "slurm":
        check_partitions(cfg, dry_run=req.dry_run)
    if run_dir is None:
        name = cfg.run.name or f"{pipe.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        run_dir = Path(cfg.run.run_dir or Path(cfg.run.root) / name)
        _check_run_dir(str(run_dir))
    return pipe, cfg, RunDir(run_dir), kind, notes


def _check_run_dir(path: str) -> None:
    # the path reaches sbatch scripts (--output, the srun command): a newline would start a script line
    if not path or hconfig.has_control(path):
        why = "is empty" if not path else "contains a control character (newline, tab, ...)"
        raise hconfig.ConfigError(f"run dir {path!r} {why}; expected a plain path. "
                                  "HINT: pass --run-dir a directory path without escapes.")
    RunDir(path).check_usable()


def check_partitions(cfg: Any, dry_run: bool = False) -> None:
    try:
        known = list(cfg.cluster.partitions or []) or scheduler.partitions()
    except RuntimeError as err:
        if not dry_run:
            raise
        print(f"warning: partitions not checked ({err})", file=sys.stderr)
        return
    for name, res in cfg.stages.items():
        if res.partition is not None and res.partition not in known:
            raise hconfig.ConfigError(
                f"stages.{name}.partition={res.partition!r} is not a partition of this cluster; "
                f"expected one of {sorted(known)}. HINT: pass stages.{name}.partition=<one of those> or --profile.")


def current_state(pipe: hplan.PipelineDef, cfg: Any, run: RunDir, kind: str, answer: Any = None):
    """(finished task keys, queued task key -> job id, never), read only: `never` are the jobs that
    can never start (an upstream job failed); a submission cancels them so that its plan submits
    their tasks again, a dry run leaves them be. `answer`: status.query_run()'s for several runs."""
    keys = [(s.name, i) for s in pipe.stages(cfg) for i in (s.items or (None,))]
    finished = run.finished(keys)
    tasks = {(t["stage"], t["item"]): t["job_id"] for t in run.tasks()}
    if kind != "slurm" or not tasks:
        return finished, {}, []
    from hpc.monitor import status  # a run with jobs only: a first submission never loads the monitor

    records, never = answer or confirmed(status.query_run(run))
    # sacct lists a job once slurmdbd has it: one just submitted is queued, as hpc.status says
    unlisted = set(run.slurm_jobs()) if records.source == "sacct" else set()
    queued = {k: jid for k, jid in tasks.items() if k not in finished and jid not in never and (
              records[jid].state in scheduler.ACTIVE if jid in records else jid in unlisted)}
    return finished, queued, sorted(never)


def found_by_token(run: RunDir, kind: str, settle: bool) -> RunDir:
    """`run`, with the jobs of earlier sbatch calls whose answer was lost found by their token
    (hpc.monitor.lost): recorded in its manifest (`settle`, under the submission lock), or in memory
    (a dry run). No scheduler call, and no monitor loaded, when no such sbatch is left."""
    if kind != "slurm" or not intents.pending(run.path):
        return run
    from hpc.monitor import lost  # only after a lost answer: a submission never loads the monitor otherwise

    if not settle:
        return lost.look(run).run
    for line in lost.settle(run):
        print(line)
    return run


def confirmed(answer: Any) -> Any:
    """status.query_run()'s answer with its active jobs checked against slurmctld (one squeue call
    at most, whatever the number of runs): a submission acts on what the controller knows now."""
    records, never = answer
    return scheduler.confirm_active(records), never


def submit_plan(plan: hplan.Plan, run: RunDir, backend: launcher.Backend, code: Optional[snapshot.JobCode] = None,
                run_id: str = "") -> Dict[str, List[str]]:
    """Start every job of the plan (hpc.pipeline.launcher); returns stage -> job ids. Every task
    runs `code` (a snapshot; None: the live tree) and exports `run_id` (hpc.rundir.tracking)."""
    book = RunBook(run, code, run_id)
    launcher.launch(plan, book, backend)
    return book.ids


def start(req: Request, backends: Optional[Mapping[str, MakeBackend]] = None) -> Submitted:
    """Plan and submit one run; returns where it went and the jobs submitted now (none for a dry run,
    or when every task is done or queued). The run dir's lock is held from reading its state to the
    last manifest write; a dry run reads the state and changes nothing: no scancel, no sbatch, no
    file written. `backends`: executor kind -> the Backend that starts its jobs, for the kinds that
    submitit does not run (hpc.api passes `here`'s, hpc.here)."""
    pipe, cfg, run, kind, notes = build(req)
    make = (backends or {}).get(kind, launcher.Submitit)
    backend = make(kind, list(cfg.cluster.setup))
    module_file = user_module_file(req.pipeline)
    code = code_version(module_file)
    if req.dry_run:  # a job found by its token (sbatch's answer lost) counts as queued, in memory only
        finished, queued, _ = current_state(pipe, cfg, found_by_token(run, kind, settle=False), kind)
        notes = [*notes, snapshot_note(cfg, run, kind, code)]
        print(backend.show(plan_for(pipe, cfg, run, backend, finished, queued, notes)))
        return Submitted(run.path, str(kind), {})
    with run.submission_lock(say=lambda line: print(line, file=sys.stderr)):
        finished, queued, never = current_state(pipe, cfg, found_by_token(run, kind, settle=True), kind)
        scheduler.cancel(never)
        # asked only here: a dry run stays one call cheaper (its plan shows each stage as one array)
        max_size = scheduler.max_array_size() if kind == "slurm" else None
        plan = plan_for(pipe, cfg, run, backend, finished, queued, notes, max_size)
        print(plan.summary())
        if not plan.jobs:
            print(f"nothing to submit: every task of {run.path} is done or queued")
            return Submitted(run.path, str(kind), {})
        if kind == "slurm":  # a run the site's submit limit cannot take whole is refused before any sbatch
            limits.refuse_past_limit([len(job.units) for job in plan.jobs], [job.resources for job in plan.jobs])
        snap = take_snapshot(cfg, run.path, kind, code, run.manifest().get("snapshot") if req.same_snapshot else None)
        # pipeline_arg: how to name the pipeline again, for a resubmission from a job (hpc.afterstep)
        run_id = run.start(pipe.name, hconfig.to_yaml(cfg), kind,
                           {**code, "pipeline_arg": req.pipeline, "snapshot": snap and snap.record()},
                           [(job.stage, item) for job in plan.jobs for item in job.items])
        ids = submit_plan(plan, run, backend, job_code(snap, req.pipeline, module_file), run_id)
    print(f"run dir: {run.path}")
    for stage, jids in ids.items():
        print(f"  {stage}: {' '.join(jids)}")
    return Submitted(run.path, str(kind), ids)


def plan_for(pipe: hplan.PipelineDef, cfg: Any, run: RunDir, backend: launcher.Backend, finished: Any, queued: Any,
             notes: Sequence[str], max_array_size: Optional[int] = None) -> hplan.Plan:
    """The plan as `backend` runs it (`here`: the batch plan, SLURM's ranks per job, checked against
    the allocation it runs in)."""
    plan = hplan.make_plan(pipe, cfg, str(run.path), backend.plans, finished, queued, max_array_size,
                           gres.node_gpus if backend.plans == "slurm" else None)
    plan = backend.shape(plan)
    boxes = spec.notes(plan.jobs, plan.kind, cfg)
    return dataclasses.replace(plan, notes=plan.notes + tuple(notes) + tuple(boxes))


