"""The one launch path: every job of a plan, its tasks built, ordered, started and recorded.

    python -m hpc.submit tiny --cluster local      # launch(plan, RunBook(run, ...), Submitit("local", setup))

A run (hpc.pipeline.submission), a sweep (hpc.sweep.launch) and `--cluster here` (hpc.here) all go
through launch(): it prints what the containers' preparation did, then per job of the plan asks the
Book for the job's tasks and, on SLURM, what they wait for, has the Backend start them, and has the
Book record their ids. Where nothing orders the stages (the local and debug executors, `here`) a
Backend returns once the job's tasks ended, and a run stops at a failed one. Nothing else submits a
stage's task (tests/test_launch_path.py).

A Book says, for a run or a sweep, which tasks a job has (tasks), what they wait for (upstream:
afterok on a run's upstream tasks, afterany on a sweep's, plus the points file of a sweep's array),
how their ids are kept (record, close) and whether a failed job stops the later ones (stops).
A packed job (hpc.pipeline.packing) is one task per group of items: the Book gets its id once per item.
Before each sbatch, the Book writes down its token and the tasks it submits (intend:
hpc.rundir.intents); the launch forgets them once the Book has recorded the job ids and closed, so
one left behind is a submission whose answer hpc never saw (hpc.monitor.lost finds its job).
A Backend says how a job's tasks start (start_job): through submitit (Submitit: sbatch on SLURM with
dependencies; the local and debug executors, each job waited for), or as srun steps of the current
allocation (hpc.here). It also shapes the plan for itself (plans, shape) and shows the dry run (show).
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Dict, List, Optional, Sequence, Tuple

from hpc import Record
from hpc.config.checks import ConfigError
from hpc.container import spec
from hpc.pipeline import arraytasks
from hpc.pipeline.plan import JobSpec, Plan
from hpc.rundir import intents
from hpc.slurm.submitenv import submission_env

Started = Sequence[Tuple[int, str]]  # (position in job.items, its job or task id)


@dataclass(eq=False, repr=False)
class Order(Record):
    """What a job's tasks wait for (SLURM only; an empty Order elsewhere)."""

    dependency: Optional[str] = None  # sbatch --dependency
    after: Any = ()  # what the Book records as waited for (a run: job ids; a sweep: per point)
    each: Sequence[Sequence[str]] = ()  # per task, the upstream task it alone waits for (aftercorr)
    points: Optional[str] = None  # a sweep's array: the file naming each task's point


class Book:
    """A run's or a sweep's side of launch(): what the tasks are and where their ids go."""

    where: Path  # the run or sweep directory: python -m hpc.status names it
    code: Any = None  # the snapshot the tasks run (hpc.rundir.snapshot.JobCode); None: the live tree
    run_id: str = ""  # the run's id (hpc.rundir.tracking); a sweep's points each have their own
    stops: bool = True  # a failed job stops the later ones where nothing orders them

    def tasks(self, job: JobSpec) -> List[Any]:
        raise NotImplementedError

    def upstream(self, job: JobSpec, ids: Dict[str, List[str]]) -> Tuple[Optional[str], Any]:
        """(the dependency on the upstream stages, what to record as waited for); `ids`: label -> job ids now."""
        raise NotImplementedError

    def points(self, job: JobSpec) -> Optional[str]:
        return None

    def record(self, job: JobSpec, started: Started, order: Order, kind: str) -> None:
        raise NotImplementedError

    def intend(self, job: JobSpec, token: str, order: Order, ids: Sequence[str],
               pickle: Optional[Tuple[str, str]] = None) -> None:
        """Before the sbatch carrying `token` runs: its tasks, written down (hpc.rundir.intents)."""
        intents.announce(self.where, token, job.stage, job.items, ids, order.after, order.each,
                         self.code.hash if self.code else None, job.folder, pickle)

    def close(self) -> None:
        """Called once, however launch() ends."""


class Recorder:
    """A job's record(): its started tasks' ids to the Book. Also the Intent its sbatch tells its
    token before it runs (hpc.pipeline.submitonce): the Book writes it down, and the launch forgets
    it once the ids are recorded (`settled`) or sbatch certainly queued nothing."""

    def __init__(self, book: Book, job: JobSpec, order: Order, kind: str, now: List[str], settled: List[str]):
        self.book, self.job, self.order, self.kind, self.now, self.settled = book, job, order, kind, now, settled
        self.ids: Sequence[str] = ()
        self.tokens: List[str] = []

    def __call__(self, started: Started) -> None:
        self.now.extend(jid for _, jid in started)
        self.book.record(self.job, started, self.order, self.kind)
        self.settled.extend(self.tokens)
        self.tokens = []

    def announcing(self, ids: Sequence[str]) -> "Recorder":
        """This recorder, as the Intent of an sbatch whose tasks get `ids` (hpc.rundir.intents.id_suffixes)."""
        self.ids = ids
        return self

    def before(self, token: str, pickle: Optional[Tuple[str, str]] = None) -> None:
        self.book.intend(self.job, token, self.order, self.ids, pickle)
        self.tokens.append(token)

    def refused(self, token: str) -> None:
        intents.drop(self.book.where, [token])
        self.tokens.remove(token)


Record = Callable[[Started], None]  # what a Backend calls with the ids it started (a Recorder)


class Backend:
    """How a job's tasks start."""

    kind: str  # the executor kind the manifest records
    plans: str  # the kind the plan is made for (hpc.pipeline.plan.make_plan)

    def shape(self, plan: Plan) -> Plan:
        return plan

    def show(self, plan: Plan) -> str:
        raise NotImplementedError

    def session(self, book: Book) -> ContextManager[Any]:
        return contextlib.nullcontext()

    def start_job(self, job: JobSpec, tasks: Sequence[Any], order: Order, record: Record) -> Optional[bool]:
        """Start the tasks of `job`, calling record() with their ids as they start; whether they all
        ended well, or None when they were only handed to a scheduler that orders them."""
        raise NotImplementedError


def launch(plan: Plan, book: Book, backend: Backend) -> Dict[str, List[str]]:
    """Start every job of the plan; returns JobSpec.label -> the job (or task) ids started now."""
    ids: Dict[str, List[str]] = {}
    failed = False
    settled: List[str] = []  # tokens whose job ids the Book has recorded
    try:
        for line in spec.prepare(plan.jobs):  # the copy of hpc the containers' srun lines name
            print(line, flush=True)
        with backend.session(book):
            for job in plan.jobs:
                if failed:
                    print(f"stage {job.stage}: not started, an earlier stage failed "
                          f"(see python -m hpc.status {book.where})", flush=True)
                    break
                order = _order(job, book, ids) if plan.kind == "slurm" else Order()
                record = Recorder(book, job, order, plan.kind, ids.setdefault(job.label, []), settled)
                try:
                    ended = backend.start_job(job, book.tasks(job), order, record)
                except Exception:
                    _say_partly_submitted(plan, job, ids, book)
                    raise
                failed = ended is False and book.stops
    finally:
        book.close()
        intents.drop(book.where, settled)  # after close(): a sweep writes its points' manifests there
    return ids


def _say_partly_submitted(plan: Plan, job: JobSpec, ids: Dict[str, List[str]], book: Book) -> None:
    """When `job` could not start after earlier jobs did (sbatch refused it: a limit hpc could not
    read), one line on stderr naming what is queued and what is not, before the refusal itself."""
    queued = [f"{label} ({' '.join(jids)})" for label, jids in ids.items() if jids]
    if queued and plan.kind == "slurm":
        rest = [j.label for j in plan.jobs[plan.jobs.index(job):]]
        print(f"submitted in part: queued {', '.join(queued)}; not submitted: {', '.join(rest)}. HINT: "
              f"python -m hpc.status {book.where} shows the queued tasks; the same command again, once there "
              "is room, submits only the tasks neither done nor queued.", file=sys.stderr, flush=True)


def _order(job: JobSpec, book: Book, ids: Dict[str, List[str]]) -> Order:
    own, after = book.upstream(job, ids)
    per_item, each = job.item_dependency(ids)
    each = unit_to_items(job, each) if each else each
    return Order(",".join(d for d in (own, per_item) if d) or None, after, each, book.points(job))


class Submitit(Backend):
    """Through submitit: SLURM (sbatch, dependencies), or the local and debug executors, which have
    none: each job is waited for before the next starts, and its unexpanded log folder dropped."""

    def __init__(self, kind: str, setup: Sequence[str] = ()):
        if kind not in ("slurm", "local", "debug"):
            raise ConfigError(f"executor kind {kind!r} is not submitit's; expected slurm, local or debug. HINT: "
                              "submit with python -m hpc.submit or hpc.submit(), which start --cluster here.")
        self.kind = self.plans = kind  # the kind as detected: it may carry why `auto` fell back
        self.setup = list(setup)

    def show(self, plan: Plan) -> str:
        return plan.render(setup=self.setup)

    def session(self, book: Book) -> ContextManager[Any]:
        return submission_env()  # the enclosing allocation's variables never reach the jobs

    def start_job(self, job: JobSpec, tasks: Sequence[Any], order: Order, record: Recorder) -> Optional[bool]:
        # only when jobs are submitted: a dry run never loads the task and the executors
        from hpc.pipeline.executor import drop_unexpanded_folder, make_executor, submit_array

        slurm = self.kind == "slurm"
        executor = make_executor(self.kind, job.folder, job.resources["max_timeouts"], job.python)
        # an array's tasks' pickles in one file (hpc.pipeline.arraytasks), not one file each
        packed = arraytasks.path_for(job.folder) if slurm and len(tasks) > 1 else None
        if self.kind != "debug":
            executor.update_parameters(**job.executor_parameters(order.dependency, self.setup, order.points, packed))
        if slurm:  # its sbatch tells `record` its token first (hpc.pipeline.submitonce)
            suffixes = intents.id_suffixes(job.task_ids or range(len(tasks)), bool(packed))
            executor.intent = record.announcing(unit_to_items(job, suffixes))  # a packed job's: per item
        submitted = submit_array(executor, tasks, job.task_ids if slurm else (), packed)
        record(list(enumerate(unit_to_items(job, [str(s.job_id) for s in submitted]))))
        if slurm:
            return None
        ok = wait_ok(submitted)  # no scheduler to order the stages: this job ends before the next starts
        drop_unexpanded_folder(job.folder)
        return ok


def unit_to_items(job: JobSpec, per_unit: Sequence[Any]) -> List[Any]:
    """Per array task of a packed job (hpc.pipeline.packing), per item: each group's value for each of
    its items, in job.items' order (they share the job); a job that is not packed: as it is."""
    if not job.groups:
        return list(per_unit)
    return [value for group, value in zip(job.groups, per_unit) for _ in group]


def wait_ok(jobs: Sequence[Any]) -> bool:
    ok = True
    for job in jobs:
        try:
            job.results()  # every rank's result: a failure on any rank fails the task
        except Exception:  # submitit re-raises the task's exception; status shows its last line
            print(f"job {job.job_id} failed")
            ok = False
    return ok
