"""Pure planning: pipeline config -> job specs that render their own sbatch text.

    python -m hpc.submit langsplat --levels 0 2 --dry-run

Pipelines register in PIPELINES (name -> module exposing PIPELINE, a PipelineDef); modules are
imported lazily so that planning never imports torch. make_plan() decides which stages and array
items still need to run (no done marker, not already queued) and which stage each waits for.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

from hpc import noderange, sbatch
from hpc.batching import plan_batch
from hpc.rundir import task_key

# name -> module path; the module defines PIPELINE. Tests and users may add entries.
PIPELINES: Dict[str, str] = {
    "langsplat": "hpc.jobs.langsplat.pipeline",
    "run": "hpc.jobs.run",
}

TaskKey = Tuple[str, Any]  # (stage name, array item or None)


@dataclass(frozen=True)
class StageDef:
    """One stage: `target` ("module:function") is called with a StageContext in every task."""

    name: str
    target: str
    items: Tuple[Any, ...] = ()  # array items (one task each); () = a single job
    after: Tuple[str, ...] = ()  # stages that must end successfully first (afterok)
    resources: str = ""  # key under cfg.stages; default: the stage name
    describe: str = ""  # what each task runs, for the plan output (default: the target)
    skip: str = ""  # why this stage is not needed (its outputs exist): listed as skipped, never submitted
    batch: Tuple[int, ...] = ()  # (global batch, most samples per device): the plan shows plan_batch per world size


@dataclass(frozen=True)
class PipelineDef:
    name: str
    schema: type  # config dataclass checked by OmegaConf
    stages: Callable[[Any], List[StageDef]]  # cfg -> stages, in submission order
    validate: Callable[[Any], None] = lambda cfg: None  # pipeline-specific input checks
    templates: Tuple[str, ...] = ()  # its files in templates/ (hpc.templates), merged in order; each must exist
    notes: Callable[[Any], List[str]] = lambda cfg: []  # cfg -> lines the plan states (choices it made)


def get_pipeline(name: str) -> PipelineDef:
    """A registered name, or a user's own `package.module[:ATTR]` defining a PipelineDef (ATTR: PIPELINE)."""
    from hpc.config import ConfigError

    module, _, attr = PIPELINES.get(name, name).partition(":")
    if name not in PIPELINES and "." not in module and not attr:
        raise ConfigError(f"unknown pipeline {name!r}; expected one of {sorted(PIPELINES)} or a module "
                          "path such as mypkg.pipelines:PIPELINE. HINT: register it in hpc.plan.PIPELINES.")
    try:
        found = getattr(importlib.import_module(module), attr or "PIPELINE")
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"pipeline {name!r} could not be loaded ({err}). HINT: the module must be "
                          "importable from the current directory and define PIPELINE "
                          "(a hpc.plan.PipelineDef).") from err
    if not isinstance(found, PipelineDef):
        raise ConfigError(f"{name!r} is a {type(found).__name__}, expected a hpc.plan.PipelineDef.")
    return found


@dataclass(frozen=True)
class JobSpec:
    """One submission: a single job or one array over the items still to run."""

    stage: str
    target: str
    items: Tuple[Any, ...]  # items submitted now; (None,) for a non-array stage
    indices: Tuple[Any, ...]  # their positions in the stage's full item list (task_index)
    is_array: bool
    resources: Dict[str, Any] = field(hash=False)
    after: Tuple[str, ...]
    folder: str  # submitit folder (logs, pickles); %j is the job id
    kind: str  # slurm | local | debug
    ranks: int  # processes per job (array task) as it will actually run; the fewest under a node range
    describe: str = ""  # what each task runs
    worlds: Tuple[int, ...] = ()  # world sizes it may get: both ends of a node range, else (ranks,)
    batch: Tuple[int, ...] = ()  # StageDef.batch

    def executor_parameters(self, dependency: Optional[str] = None, setup: Sequence[str] = ()) -> Dict[str, Any]:
        if self.kind == "slurm":
            return sbatch.slurm_parameters(self.resources, self.stage, dependency, setup)
        return sbatch.local_parameters(self.resources)

    def sbatch_text(self, python: Optional[str] = None, setup: Sequence[str] = ()) -> str:
        dependency = ",".join(f"afterok:<{s}>" for s in self.after) or None
        size = len(self.items) if self.is_array else None
        params = sbatch.slurm_parameters(self.resources, self.stage, dependency, setup)
        return sbatch.render(params, self.folder, size, python)


@dataclass(frozen=True)
class Plan:
    pipeline: str
    run_dir: str
    kind: str
    jobs: Tuple[JobSpec, ...]
    skipped: Tuple[str, ...]  # "stage[item]: why" lines
    notes: Tuple[str, ...]

    def render(self, python: Optional[str] = None, setup: Sequence[str] = ()) -> str:
        """The summary, then the sbatch script of every job (the dry-run output)."""
        label = "sbatch script" + ("" if self.kind == "slurm"
                                   else f" on SLURM (the {self.kind} executor runs no sbatch)")
        lines = [self.summary()]
        for job in self.jobs:
            lines += ["", f"# ---- {label}: stage {job.stage} ----", job.sbatch_text(python, setup)]
        return "\n".join(lines)

    def summary(self) -> str:
        """Which stages and items run, how many ranks, after what; what is skipped and why."""
        lines = [f"plan: pipeline {self.pipeline} -> {self.run_dir} (executor: {self.kind})"]
        for job in self.jobs:
            items = f" items {list(job.items)}" if job.is_array else ""
            how = "afterok" if self.kind == "slurm" else "submitted when it has ended"
            after = f" after {', '.join(job.after)} ({how})" if job.after else ""
            lines.append(f"  stage {job.stage}:{items} {_rank_text(job)} per job{after}")
            lines.append(f"    each task runs {job.describe}")
            lines += [f"    {line}" for line in batch_lines(job.batch, job.worlds or (job.ranks,))]
        lines += [f"  skip {s}" for s in self.skipped]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def make_plan(pipe: PipelineDef, cfg: Any, run_dir: str, kind: str,
              finished: FrozenSet[TaskKey] = frozenset(), queued: FrozenSet[TaskKey] = frozenset()) -> Plan:
    """Which jobs to submit now. `finished`: tasks with a done marker; `queued`: tasks still in the queue.
    `kind` may carry why `auto` fell back from SLURM (hpc.scheduler.Kind): the notes then say it."""
    jobs: List[JobSpec] = []
    skipped: List[str] = []
    notes: List[str] = []
    not_todo = finished | queued
    notes.extend(pipe.notes(cfg))
    for stage in pipe.stages(cfg):
        if stage.skip:  # stages waiting on it wait only for what is submitted or queued
            skipped.append(f"{stage.name}: {stage.skip}")
            continue
        keys = [(stage.name, item) for item in (stage.items or (None,))]
        todo = tuple(item for (_, item) in keys if (stage.name, item) not in not_todo)
        for key in keys:
            if key in finished:
                skipped.append(f"{task_key(*key)}: done marker present")
            elif key in queued:
                skipped.append(f"{task_key(*key)}: already queued or running")
        if not todo:
            continue
        res = dict(_plain(cfg.stages[stage.resources or stage.name]))
        ranks, note = _ranks(stage.name, res, kind)
        if note:
            notes.append(note)
        # wait for what is submitted now or still queued from an earlier submission
        after = tuple(s for s in stage.after if any(j.stage == s for j in jobs) or any(k[0] == s for k in queued))
        jobs.append(JobSpec(stage=stage.name, target=stage.target, items=todo, is_array=bool(stage.items),
                            indices=tuple(stage.items.index(i) if stage.items else None for i in todo),
                            resources=res, after=after, folder=f"{run_dir}/{stage.name}/logs/%j",
                            kind=kind, ranks=ranks[0], describe=stage.describe or stage.target,
                            worlds=ranks, batch=tuple(stage.batch)))
    notes += _fallback_notes(pipe, cfg, getattr(kind, "why_not_slurm", ""))
    if kind != "slurm" and len(jobs) > 1:
        notes.append("the local executor has no afterok: stages run one after another, "
                     "and submit waits for each before starting the next")
    return Plan(pipe.name, run_dir, kind, tuple(jobs), tuple(skipped), tuple(notes))


def _fallback_notes(pipe: PipelineDef, cfg: Any, why_not_slurm: str) -> List[str]:
    """What `--cluster auto` falling back to the local executor means for each stage that asks for
    GPUs, in words, with the reason no SLURM answered."""
    if not why_not_slurm:
        return []
    notes = []
    for stage in pipe.stages(cfg):
        res = _plain(cfg.stages[stage.resources or stage.name])
        if res["gpus_per_node"]:
            notes.append(f"no SLURM answered ({why_not_slurm}); stage {stage.name} asks for "
                         f"{res['gpus_per_node']} GPUs per node and runs as {res['local_tasks']} CPU "
                         "process(es) here")
    return notes or [f"no SLURM answered ({why_not_slurm}); running on this machine"]


def _ranks(stage: str, res: Dict[str, Any], kind: str) -> Tuple[Tuple[int, ...], str]:
    """The world sizes a job may run with (both ends of a node range; one otherwise), and a note
    when the executor runs another number of processes than SLURM would."""
    lo, hi = noderange.bounds(res["nodes"])
    requested = tuple(sorted({lo * res["tasks_per_node"], hi * res["tasks_per_node"]}))
    if kind == "slurm":
        return requested, ""
    actual = res["local_tasks"]
    if requested == (actual,):
        return requested, ""
    return (actual,), (f"stage {stage}: requested {noderange.show((lo, hi))} node(s) x {res['tasks_per_node']} "
                       f"task(s) = {'-'.join(map(str, requested))} rank(s); the {kind} executor runs {actual} "
                       "process(es) on this machine's CPU")


def _rank_text(job: JobSpec) -> str:
    """'4 rank(s)'; under a node range '1-2 node(s) x 2 task(s) = 2-4 rank(s)'."""
    worlds = job.worlds or (job.ranks,)
    if len(worlds) == 1:
        return f"{worlds[0]} rank(s)"
    return (f"{noderange.show(noderange.bounds(job.resources['nodes']))} node(s) x {job.resources['tasks_per_node']} task(s) = "
            f"{worlds[0]}-{worlds[-1]} rank(s)")


def batch_lines(batch: Sequence[int], worlds: Sequence[int]) -> List[str]:
    """The batch plan (hpc.batching.plan_batch) at each world size; one that cannot split says so."""
    if not batch:
        return []
    global_batch, per_device_max = batch
    lines = []
    for world in worlds:
        try:
            b = plan_batch(global_batch, per_device_max, world)
        except ValueError as err:
            lines.append(f"batch at {world} rank(s): cannot plan: {err}")
            continue
        lines.append(f"batch at {world} rank(s): global {b.global_batch} = {b.micro_batch} per micro-batch x "
                     f"{b.accum_steps} accumulation step(s) x {world} rank(s)")
    return lines


def _plain(node: Any) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(node, resolve=True) if not isinstance(node, dict) else node
