"""The submission engine: a Request -> config, plan, code snapshot, jobs through submitit.

    from hpc.pipeline.submission import Request, submit
    submit(Request("langsplat", levels=(0, 1, 2), cluster="local", wait=True))   # python -m hpc.submit ...

Request (hpc.pipeline.request) holds what `python -m hpc.submit` reads, typed; the command (hpc.submit)
and sweeps (hpc.sweep.submission, which does the same for every point) both call this module. The
jobs start on the one launch path (hpc.pipeline.launcher) with a run's Book (RunBook: afterok on the
upstream tasks, the manifest written as each job starts) and the Backend of the executor kind:
submitit's, or one the caller passes (hpc.api: `--cluster here`'s).
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
from hpc.pipeline import launcher, packing
from hpc.pipeline import plan as hplan
from hpc.pipeline.request import Request, Submitted
from hpc.rundir import codefiles, intents, snapcache, snapshot
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
        if kind != "slurm":  # --cluster here plans as SLURM does; its steps run items one by one
            packing.refuse_submission(plan.jobs)
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


def pipeline_module(pipeline: str) -> str:
    return hplan.PIPELINES.get(pipeline, pipeline).partition(":")[0]


def user_module_file(pipeline: str) -> Optional[str]:
    """The file of a user's pipeline module (get_pipeline imported it); None for hpc's own."""
    module = pipeline_module(pipeline)
    if module.split(".")[0] == "hpc":
        return None
    return getattr(sys.modules.get(module), "__file__", None)


def take_snapshot(cfg: Any, where: Path, kind: str, code: Dict[str, Any],
                  same: Optional[Dict[str, Any]] = None) -> Optional[snapshot.Snapshot]:
    """Copy the user's code into the store of `where`'s root (a run or sweep dir; hpc.rundir.snapshot), or
    run a copy there whose files did not change; `same`: a manifest's snapshot record to run again as it is
    (--same-snapshot). None when run.snapshot=false, or for the debug executor, which runs the jobs
    in this very process: its imports are the live tree's, whatever the snapshot holds."""
    if not cfg.run.snapshot or kind == "debug":
        return None
    found = snapshot.recorded(same) if same else None
    if found is None:
        source = codefiles.source_of(code.get("code_dir"), Path.cwd(), [where, Path(cfg.run.root)])
        found = snapshot.take(source, where, cfg.run.snapshot_max_mb)
    print(found.summary())
    return found


def job_code(snap: Optional[snapshot.Snapshot], pipeline: str, module_file: Optional[str]
             ) -> Optional[snapshot.JobCode]:
    """Where the tasks run and import from: the snapshot's copies of this directory and of the
    pipeline module's import root."""
    return snap and snap.job_code(Path.cwd(), codefiles.import_root(module_file, pipeline_module(pipeline)))


def snapshot_note(cfg: Any, run: RunDir, kind: str, code: Dict[str, Any]) -> str:
    """What a submission would snapshot, for the dry run (which copies nothing)."""
    if not cfg.run.snapshot:
        return "code: no snapshot (run.snapshot=false): the jobs import the live tree when they start"
    if kind == "debug":
        return "code: no snapshot: the debug executor runs the jobs in this process, on the live tree"
    where = f"the git checkout {code['code_dir']}" if code.get("code_dir") else f"the directory {Path.cwd()}"
    return (f"code: {where} is copied into {snapcache.store_of(run.path)}/ at submission (a snapshot of the same "
            "files there is run as it is), and every job imports that copy")
