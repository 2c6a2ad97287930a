"""Pure planning: pipeline config -> job specs that render their own sbatch text.

    python -m hpc.submit langsplat --levels 0 2 --dry-run

A pipeline and its stages (PipelineDef, StageDef, the registry PIPELINES) are defined in
hpc.pipeline.pipedef and importable from here. make_plan() decides which stages and array items
still need to run (no done marker, not already queued) and which stage each waits for; each
stage's resources, their checks and notes come from hpc.pipeline.resources. Planning never imports torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple, Union

from hpc import Frozen
from hpc.config.checks import ConfigError
from hpc.container import spec
from hpc.pipeline import arrays, packing, resources, sbatch, worlds
from hpc.pipeline.pipedef import PIPELINES, PipelineDef, StageDef, get_pipeline
from hpc.rundir import logdirs
from hpc.rundir.run import task_key

# The definitions (hpc.pipeline.pipedef) keep their documented home here: hpc.pipeline.plan.PipelineDef
__all__ = ["PIPELINES", "PipelineDef", "StageDef", "get_pipeline", "TaskKey", "JobSpec", "Plan", "make_plan"]

TaskKey = Tuple[str, Any]  # (stage name, array item or None)
# The plan's classes are never compared or printed: no generated __repr__ or __eq__ (imports cost a submission)


@dataclass(repr=False, eq=False)
class JobSpec(Frozen):
    """One submission: a single job or one array over the items still to run."""

    stage: str
    target: str
    items: Tuple[Any, ...]  # items submitted now; (None,) for a non-array stage
    indices: Tuple[Any, ...]  # their positions in the stage's full item list (task_index)
    is_array: bool
    resources: Dict[str, Any] = field(hash=False)
    after: Tuple[str, ...]
    folder: str  # submitit folder (logs, pickles): %j the job's id, %A an array's (hpc.rundir.logdirs)
    kind: str  # slurm | local | debug
    ranks: int  # processes per job (array task) as it will actually run; the fewest under a node range
    describe: str = ""  # what each task runs
    worlds: Tuple[int, ...] = ()  # world sizes it may get: both ends of a node range, else (ranks,)
    batch: Tuple[int, ...] = ()  # StageDef.batch
    item_after: str = ""  # StageDef.per_item_after
    waits: Tuple[arrays.Ref, ...] = ()  # per item, the item_after task it waits for (hpc.pipeline.arrays)
    part: Tuple[int, int] = (1, 1)  # (k, n): the k-th of the n arrays this stage is submitted as
    task_ids: Tuple[int, ...] = ()  # per item, its array task id (the aftercorr pairing); (): 0..n-1
    item_of: Optional[Callable[[Any], Any]] = field(default=None, compare=False)  # StageDef.per_item_of
    # a packed stage (hpc.pipeline.packing): per job (array task) the items it runs side by side; waits
    # and task_ids are then per group, and `resources` the whole job's
    groups: Tuple[Tuple[Any, ...], ...] = ()
    section: str = ""  # the stage's key under cfg.stages

    @property
    def units(self) -> Tuple[Any, ...]:
        """What one array task runs: an item, or a packed group of items."""
        return self.groups or self.items

    @property
    def label(self) -> str:
        """The stage name, or 'stage#k' for the k-th of several arrays of one stage."""
        return self.stage if self.part[1] == 1 else f"{self.stage}#{self.part[0]}"

    def item_dependency(self, ids: Optional[Mapping[str, Sequence[str]]] = None
                        ) -> Tuple[Optional[str], List[List[str]]]:
        """hpc.pipeline.arrays.dependency: the aftercorr/afterok term and each item's upstream job id."""
        up = self.item_of or (lambda i: i)
        return arrays.dependency(arrays.Part(self.units, self.waits or (None,) * len(self.units)),
                                 self.item_after, ids, (lambda g: up(g[0])) if self.groups else self.item_of)

    def executor_parameters(self, dependency: Optional[str] = None, setup: Sequence[str] = (),
                            points: Optional[str] = None, tasks: Optional[str] = None) -> Dict[str, Any]:
        """`points`: a sweep array's file naming each task's point, `tasks`: the file of its tasks'
        pickles (hpc.pipeline.arraytasks), both for hpc.afterstep (a packed job's: hpc.pipeline.packrun)."""
        if self.kind == "slurm":
            return packing.batch_setup(self, sbatch.slurm_parameters(self.resources, self.stage, dependency, setup,
                                                                     self.run_dir, self.task_ids, points, tasks),
                                       self.run_dir, tasks)
        return sbatch.local_parameters(self.resources)

    @property
    def run_dir(self) -> str:
        return self.folder.rsplit("/", 3)[0]  # the folder is <run_dir>/<stage>/logs/%j or %A (make_plan)

    def sbatch_text(self, python: Optional[str] = None, setup: Sequence[str] = (), how: str = "afterok") -> str:
        """`how`: the dependency type on the `after` stages (a sweep's arrays wait afterany)."""
        per_item, _ = self.item_dependency()
        dependency = ",".join([f"{how}:<{s}>" for s in self.after] + [per_item] * bool(per_item)) or None
        size = len(self.units) if self.is_array else None
        params = packing.batch_setup(self, sbatch.slurm_parameters(self.resources, self.stage, dependency, setup,
                                                                   self.run_dir, self.task_ids), self.run_dir, None)
        return sbatch.render(params, self.folder, size, python or self.python)

    @property
    def python(self) -> Optional[str]:
        """The interpreter text of the srun line inside a container (hpc.container.spec); None: this one's."""
        box = self.resources.get("container")
        return spec.launch(box, self.resources["gpus_per_node"]).python if box else None


@dataclass(repr=False, eq=False)
class Plan(Frozen):
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
            lines += ["", f"# ---- {label}: stage {job.label} ----", job.sbatch_text(python, setup)]
        return "\n".join(lines)

    def summary(self) -> str:
        """Which stages and items run, how many ranks, after what; what is skipped and why."""
        lines = [f"plan: pipeline {self.pipeline} -> {self.run_dir} (executor: {self.kind})"]
        for job in self.jobs:
            items = f" items {list(job.items)}" if job.is_array else ""
            items += f" (task ids {arrays.spec(job.task_ids).partition('%')[0]})" if job.task_ids else ""
            part = f" (array {job.part[0]} of {job.part[1]})" if job.part[1] > 1 else ""
            how = "afterok" if self.kind == "slurm" else "submitted when it has ended"
            waits = [f"{', '.join(job.after)} ({how})"] * bool(job.after) + _item_wait(job, how)
            after = f" after {', '.join(waits)}" if waits else ""
            lines.append(f"  stage {job.stage}{part}:{items} {worlds.rank_text(job)} per {'item' if job.groups else 'job'}{after}")
            lines.append(f"    each task runs {job.describe}")
            lines += [f"    {line}" for line in (packing.lines(job) if job.groups else [])]
            lines += [f"    {line}" for line in worlds.batch_lines(job.batch, job.worlds or (job.ranks,))]
        lines += [f"  skip {s}" for s in self.skipped]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def make_plan(pipe: PipelineDef, cfg: Any, run_dir: str, kind: str,
              finished: FrozenSet[TaskKey] = frozenset(),
              queued: Union[FrozenSet[TaskKey], Mapping[TaskKey, str]] = frozenset(),
              max_array_size: Optional[int] = None,
              node_gpus: Optional[Callable[[Optional[str]], Optional[int]]] = None) -> Plan:
    """Which jobs to submit now. `finished`: tasks with a done marker; `queued`: tasks still in the
    queue, as task key -> job id where a stage waits on them item by item (per_item_after).
    `max_array_size`: the cluster's MaxArraySize (task ids 0 to it - 1); a larger stage is split
    into several arrays (None: no limit). `node_gpus`: partition -> its GPUs per node (None: unknown),
    asked for packed stages only (hpc.slurm.gres.node_gpus). `kind` may carry why `auto` fell back from SLURM
    (hpc.slurm.scheduler.Kind): the notes then say it."""
    jobs: List[JobSpec] = []
    skipped: List[str] = []
    notes: List[str] = []
    not_todo = finished | frozenset(queued)
    placed: Dict[TaskKey, arrays.Ref] = {}  # (stage, item) -> (label, task id) of what is submitted now
    notes.extend(pipe.notes(cfg))
    defined: Dict[str, StageDef] = {}
    for stage in pipe.stages(cfg):
        _check_per_item(stage, defined)
        defined[stage.name] = stage
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
        res, ranks, note, early = resources.of_stage(cfg, stage.name, stage.resources or stage.name, stage.batch,
                                                     kind, run_dir)
        notes += [note] * bool(note)
        notes += [early] * bool(early and early not in notes)  # stages sharing one resources section: one note
        # wait for what is submitted now or still queued from an earlier submission
        after = tuple(s for s in stage.after if any(j.stage == s for j in jobs) or any(k[0] == s for k in queued))
        up_item = stage.per_item_of or (lambda i: i)
        where = {i: arrays.locate((stage.per_item_after, up_item(i)), placed, queued)
                 for i in todo} if stage.per_item_after and kind == "slurm" else {}
        # the local executor runs stages in order: it names the stage only when it runs it now
        item_after = stage.per_item_after if kind == "slurm" or any(j.stage == stage.per_item_after
                                                                    for j in jobs) else ""
        units, where, res, said = packing.apply(stage.resources or stage.name, bool(stage.items), res, todo, where,
                                                kind, node_gpus, cfg)
        notes += said
        split = packing.apart(arrays.parts(units, where, max_array_size if stage.items else None), res, units is not todo)
        position = {item: n for n, item in reversed(list(enumerate(stage.items)))}  # .index(): each a scan
        if len(arrays.chunks(units, max_array_size)) > 1 and stage.items:
            notes.append(f"stage {stage.name}: {len(units)} items, more than the cluster's MaxArraySize "
                         f"{max_array_size}: submitted as {len(split)} arrays")
        elif len(split) > 1 and (stage.per_item_of or any(j.groups for j in jobs if j.stage == stage.per_item_after)):
            notes.append(f"stage {stage.name}: {len(split)} arrays, as several of its tasks wait on one "
                         f"{stage.per_item_after} task and aftercorr pairs one task id with one")
        for n, part in enumerate(split, 1):
            groups = part.items if units is not todo else ()
            items = tuple(i for g in groups for i in g) if groups else part.items
            job = JobSpec(stage=stage.name, target=stage.target, items=items, is_array=bool(stage.items),
                          indices=tuple(position[i] if stage.items else None for i in items),
                          resources=packing.fit(res, groups, cfg), after=after,
                          folder=logdirs.pattern(f"{run_dir}/{stage.name}/logs", kind == "slurm" and len(part.items) > 1),
                          kind=kind, ranks=ranks[0], describe=stage.describe or stage.target,
                          worlds=ranks, batch=tuple(stage.batch), item_after=item_after,
                          waits=part.waits if any(w is not None for w in part.waits) else (),
                          part=(n, len(split)), task_ids=part.ids, item_of=stage.per_item_of,
                          groups=groups, section=stage.resources or stage.name)
            placed.update({(stage.name, i): (job.label, t) for t, unit in zip(part.task_ids, part.items)
                           for i in (unit if groups else (unit,))})
            jobs.append(job)
    notes += resources.fallback_notes(pipe.stages(cfg), cfg, getattr(kind, "why_not_slurm", ""))
    if kind != "slurm" and len(jobs) > 1:
        notes.append("the local executor has no afterok: stages run one after another, "
                     "and submit waits for each before starting the next")
    return Plan(pipe.name, run_dir, kind, tuple(jobs), tuple(skipped), tuple(notes))


def _check_per_item(stage: StageDef, defined: Mapping[str, StageDef]) -> None:
    """per_item_after names an earlier array stage holding every item of this array stage."""
    up = defined.get(stage.per_item_after)
    mine = set(map(stage.per_item_of, stage.items) if stage.per_item_of else stage.items)
    if not stage.per_item_after or (up and stage.items and up.items and mine <= set(up.items)
                                    and up.name not in stage.after):
        return
    raise ConfigError(f"stage {stage.name}: per_item_after={stage.per_item_after!r} with items {list(stage.items)}; "
                      "expected an earlier array stage, not also in `after`, with every one of these items "
                      f"(earlier stages: {sorted(defined)}). HINT: fix the pipeline's StageDef list.")


def _item_wait(job: JobSpec, how: str) -> List[str]:
    """How `job` waits on its per_item_after stage, in words ([] when it waits on none of it)."""
    if not job.item_after or (job.kind == "slurm" and not job.waits):
        return []
    if job.kind != "slurm":
        return [f"{job.item_after} ({how})"]
    if job.groups:
        return [packing.wait_text(job)]
    if len(job.items) == 1:
        return [f"{task_key(job.item_after, (job.item_of or (lambda i: i))(job.items[0]))} (afterok)"]
    array = job.waits[0][0] if isinstance(job.waits[0], tuple) else f"job {job.waits[0].split('_')[0]}"
    return [f"{job.item_after}[k] for each item k (aftercorr on {array})"]
