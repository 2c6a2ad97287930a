"""`--cluster here`: a run's stages as srun steps of the allocation this shell is in (salloc).

    salloc -N 2 --ntasks-per-node=2 --gres=gpu:2
    python -m hpc.submit langsplat --profile sandbox --levels 1 --cluster here --run-dir runs/dev

The plan is the batch submission's (hpc.pipeline.plan, with SLURM's ranks per job), and so are the
run directory, the code snapshot, the manifest, the done markers, the checkpoints and the launch
path (hpc.pipeline.launcher): only the Backend differs. Here, the Backend hpc.api hands the engine
for this kind, runs the stages one after another in plan order (start_job: one job's tasks); a
stage's tasks run side by side as far as the allocation's nodes hold them (`srun --exact`), each task
one step with its stage's ranks, nodes and GPUs whatever the allocation exports (hpc.here.alloc),
named `hpc-<stage>.<run id>.h<n>`, whose ranks run hpc.here.rank (hpc.here.steps starts, serves and
reports each step). No sbatch: `sacct -j $SLURM_JOB_ID` lists the steps.

Ctrl-C (SIGINT to this process; srun is kept out of the terminal's process group) sends SIGTERM to
the tasks of this command's running steps, by their names (another run in the same allocation has
its own), with `scancel --signal=TERM JOB.STEP`, as a preemption would: the stage saves its checkpoint
and stops, never requeued (stopsignal.INTERACTIVE_ENV, read by hpc.recovery.preemption), and this
process raises KeyboardInterrupt. The same command again skips the tasks with a done marker and
resumes the interrupted one from its checkpoint. A second Ctrl-C ends the steps at once
(hpc.here.stops). A stage asking for more nodes, GPUs or CPUs per node than the allocation has
is refused before anything runs (check_fits), with both sets of numbers. A packed stage
(stages.X.pack=k) runs each item as its own step of one item's resources, up to k side by side on a node.

A stage with a container section runs its ranks in the image as a batch job's do (hpc.here.steps.step_argv).
What a rank asks the host (hpc.recovery.hostact) this process answers while the step runs: the
allocation's EndTime, a `run` stage's stop deadline; a stop request, never a requeue here, with what
stopped the step: a hang, the allocation's time limit or preemption, Ctrl-C (hpc.here.stops.stopped).
So a rank inside or outside an image needs no SLURM client, and stops and resumes the same way.
"""
from __future__ import annotations

import contextlib
import dataclasses
import shlex
import sys
import time
from typing import Any, Iterator, List, Optional, Sequence

from hpc.here import stops
from hpc.here.alloc import Allocation, check_fits, current, width
from hpc.here.steps import NAME, Step, report, serve, start_step, step_argv
from hpc.pipeline import launcher, packing
from hpc.pipeline.plan import JobSpec, Plan
from hpc.recovery import hostact
from hpc.rundir import tracking
from hpc.rundir.run import RunDir

HERE = "here"  # the executor kind, in the config (cluster.kind) and in the manifest
WAIT_SLICE_S = 0.2  # polls of the running steps: a Ctrl-C is acted on within one slice


def as_steps(plan: Plan, alloc: Allocation) -> Plan:
    """The batch plan as this mode runs it: checked against the allocation, with its srun lines."""
    plan = dataclasses.replace(plan, jobs=tuple(packing.unpacked(job) for job in plan.jobs),
                               notes=plan.notes + tuple(packing.here_lines(plan.jobs)))
    check_fits(plan.jobs, alloc)
    lines = [f"every stage runs as srun steps of allocation {alloc.job_id} ({alloc.show()}), one stage "
             "after another; Ctrl-C checkpoints and stops, the same command resumes"]
    lines += [f"stage {job.label}: {shlex.join(step_argv(job, alloc, '<logs>', '<task.pkl>'))} "
              f"({min(width(job, alloc), len(job.items))} task(s) side by side)" for job in plan.jobs]
    return dataclasses.replace(plan, kind=HERE, notes=plan.notes + tuple(lines))


class Here(launcher.Backend):
    """The launch path's backend for `--cluster here` (hpc.pipeline.launcher): a job's tasks as steps of
    the allocation, as many side by side as it holds, the ranks' questions answered meanwhile;
    start_job returns once they ended. Raises KeyboardInterrupt after a Ctrl-C, once the running
    steps have stopped."""

    kind, plans = HERE, "slurm"  # the batch plan (SLURM's ranks per job), then checked against the allocation

    def __init__(self, kind: str = HERE, setup: Sequence[str] = (), alloc: Optional[Allocation] = None):
        self.setup, self._alloc = list(setup), alloc
        self.running: List[Step] = []

    @property
    def alloc(self) -> Allocation:
        if self._alloc is None:
            self._alloc = current()
        return self._alloc

    def shape(self, plan: Plan) -> Plan:
        return as_steps(plan, self.alloc)

    def show(self, plan: Plan) -> str:
        return plan.summary()

    @contextlib.contextmanager
    def session(self, book: launcher.Book) -> Iterator[None]:
        self.run = RunDir(book.where)
        self.seq = sum(j["executor"] == HERE for t in self.run.tasks() for j in t["jobs"])
        self.names = book.run_id or tracking.new_run_id(self.run.path.name)  # unique to this run: its steps' names
        with stops.Interrupt() as self.stop, stops.Reaper(self.running):
            yield

    def start_job(self, job: JobSpec, tasks: Sequence[Any], order: launcher.Order, record: launcher.Record) -> bool:
        from hpc.pipeline.executor import _dumps  # the task's modules: only once something runs

        alloc, stop, running, failed = self.alloc, self.stop, self.running, False
        todo = list(enumerate(tasks))
        served = 0.0
        while todo or running:
            while todo and len(running) < width(job, alloc) and not stop.asked:
                (n, task), self.seq = todo.pop(0), self.seq + 1
                running.append(start_step(job, task.item, f"{alloc.job_id}.h{self.seq}", _dumps(task), self.run.path,
                                          alloc, self.setup, NAME.format(stage=job.stage, run=self.names, seq=self.seq),
                                          lambda task_id, n=n: record([(n, task_id)])))
            todo = [] if stop.asked else todo
            time.sleep(WAIT_SLICE_S)
            stop.act(running, alloc)
            if time.monotonic() - served >= hostact.POLL_S:  # one listing a second per step, as hpc.afterstep
                served = time.monotonic()
                for step in running:
                    serve(step, alloc, stop.got)
            for step in [s for s in running if s.proc.poll() is not None]:
                running.remove(step)
                failed = not report(step, self.run) or failed
        if stop.asked:
            print(f"interrupted: the stopped tasks saved their checkpoints; the same command resumes them "
                  f"(python -m hpc.status {self.run.path})", file=sys.stderr, flush=True)
            raise KeyboardInterrupt
        return not failed
