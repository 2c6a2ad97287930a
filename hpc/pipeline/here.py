"""`--cluster here`: a run's stages as srun steps of the allocation this shell is in (salloc).

    salloc -N 2 --ntasks-per-node=2 --gres=gpu:2
    python -m hpc.submit langsplat --profile sandbox --levels 1 --cluster here --run-dir runs/dev

The plan is the batch submission's (hpc.pipeline.plan, with SLURM's ranks per job), and so are the
run directory, the code snapshot, the manifest, the done markers, the checkpoints and the launch
path (hpc.pipeline.launcher): only the Backend differs (Here: start_job runs one job's tasks). Stages run one after another in plan order; a stage's tasks run side by side as far
as the allocation's nodes hold them (`srun --exact`), each task one step with its stage's ranks, nodes
and GPUs whatever the allocation exports (hpc.pipeline.herealloc), named `hpc-<stage>.<run id>.h<n>`,
whose ranks run hpc.pipeline.herestep. No sbatch: `sacct -j $SLURM_JOB_ID` lists the steps. A step
that ends with no result of its task (srun refused it, a setup line failed) gets srun's words as its
error, so hpc.status reads FAILED and why.

Ctrl-C (SIGINT to this process; srun is kept out of the terminal's process group) sends SIGTERM to
the tasks of this command's running steps, by their names (another run in the same allocation has
its own), with `scancel --signal=TERM JOB.STEP`, as a preemption would: the stage saves its checkpoint
and stops, never requeued (stopsignal.INTERACTIVE_ENV, read by hpc.recovery.preemption), and this
process raises KeyboardInterrupt. The same command again skips the tasks with a done marker and
resumes the interrupted one from its checkpoint. A second Ctrl-C ends the steps at once
(hpc.pipeline.herestop). A stage asking for more nodes, GPUs or CPUs per node than the allocation has
is refused before anything runs (check_fits), with both sets of numbers.

A stage with a container section runs its ranks in the image as a batch job's do: step_argv adds
spec.launch()'s srun options and interpreter (hpc carried in included), and its shell lines run on
the host, before srun. What a rank asks the host (hpc.recovery.hostact: HPC_HOST_ACTS names a folder per
step) this process answers while the step runs (serve): the allocation's EndTime, a `run` stage's stop
deadline; a stop request, never a requeue here, with what stopped the step: a hang, the allocation's
time limit or preemption, Ctrl-C (herestop.stopped). So a rank inside or outside an image needs no
SLURM client, and stops and resumes the same way.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Deque, Iterator, List, Mapping, Optional, Sequence

from hpc.container import spec
from hpc.fs import sharedfs
from hpc.pipeline import herestep, herestop, launcher
from hpc.pipeline.herealloc import Allocation, check_fits, current, srun_argv, step_env, width
from hpc.pipeline.plan import JobSpec, Plan
from hpc.recovery import hostact
from hpc.recovery.stopsignal import INTERACTIVE_ENV
from hpc.rundir import logdirs, tracking
from hpc.rundir.run import RunDir, task_key
from hpc.runtime.distenv import master_port_for
from hpc.slurm import scheduler

HERE = "here"  # the executor kind, in the config (cluster.kind) and in the manifest
WAIT_SLICE_S = 0.2  # polls of the running steps: a Ctrl-C is acted on within one slice
NAME = "hpc-{stage}.{run}.h{seq}"  # a step's name: its stage, its run's id, its number in the run
SAID = 20  # srun's own last lines kept per step: what it said when a step ends with no result


def as_steps(plan: Plan, alloc: Allocation) -> Plan:
    """The batch plan as this mode runs it: checked against the allocation, with its srun lines."""
    check_fits(plan.jobs, alloc)
    lines = [f"every stage runs as srun steps of allocation {alloc.job_id} ({alloc.show()}), one stage "
             "after another; Ctrl-C checkpoints and stops, the same command resumes"]
    lines += [f"stage {job.label}: {shlex.join(step_argv(job, alloc, '<logs>', '<task.pkl>'))} "
              f"({min(width(job, alloc), len(job.items))} task(s) side by side)" for job in plan.jobs]
    return dataclasses.replace(plan, kind=HERE, notes=plan.notes + tuple(lines))


def step_argv(job: JobSpec, alloc: Allocation, logs: str, pickle: str, setup: Sequence[str] = (),
              name: str = "") -> List[str]:
    """The whole command of one task's step (`name`: NAME's): srun and what each rank runs
    (hpc.pipeline.herestep), in the stage's container as its batch job's srun line has it
    (spec.launch: one builder for both). `setup` (cluster.setup) runs in each rank before the
    task, or, with a container, on the host before srun as in a batch script, after the container's
    own lines (its `env`)."""
    box = job.resources.get("container")
    task = ["-u", "-m", "hpc.pipeline.herestep", pickle]
    srun = srun_argv(job, alloc, logs, name or NAME.format(stage=job.stage, run="<run id>", seq="<n>"))
    if not box:
        rank = [sys.executable, *task]
        if setup:  # what a batch script runs before srun, here in each rank before the task
            rank = ["bash", "-c", "; ".join(setup) + '; exec "$@"', "bash", *rank]
        return srun + rank
    inside = spec.launch(box, job.resources["gpus_per_node"])
    argv = srun + list(inside.srun_args) + shlex.split(inside.python) + task
    lines = [*inside.setup, *setup]
    return ["bash", "-c", "; ".join(lines) + '; exec "$@"', "bash", *argv] if lines else argv


@dataclass
class Step:
    job: JobSpec
    item: Any
    task_id: str  # the manifest's job id of this task: <allocation>.h<n>
    proc: "subprocess.Popen[bytes]"
    stopped: bool = False
    host: str = ""  # the request file its ranks write to (hpc.recovery.hostact.ENV), answered by serve()
    name: str = ""  # its SLURM step name (NAME): only this command's steps are signalled (herestop)
    logs: str = ""  # its logs' prefix: <folder>/<task id>
    said: Deque[str] = field(default_factory=lambda: collections.deque(maxlen=SAID))  # srun's last lines
    relay: Optional[threading.Thread] = None  # copies srun's own stderr to ours, keeping its last lines


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
        with herestop.Interrupt() as self.stop, herestop.Reaper(self.running):
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
                failed = not _report(step, self.run) or failed
        if stop.asked:
            print(f"interrupted: the stopped tasks saved their checkpoints; the same command resumes them "
                  f"(python -m hpc.status {self.run.path})", file=sys.stderr, flush=True)
            raise KeyboardInterrupt
        return not failed


def start_step(job: JobSpec, item: Any, task_id: str, pickled: bytes, run_dir: Path, alloc: Allocation,
               setup: Sequence[str], name: str, record: Callable[[str], None]) -> Step:
    """One task's step: its pickle beside its logs, its id recorded, its ranks' folder made, srun started."""
    folder = Path(logdirs.expand(job.folder, task_id))
    folder.mkdir(parents=True, exist_ok=True)
    pickle_path = folder / f"{task_id}{herestep.TASK_SUFFIX}"
    pickle_path.write_bytes(pickled)
    record(task_id)
    seq = int(task_id.rpartition(".h")[2])
    host = Path(hostact.request_path(str(run_dir), task_id))  # as a batch job's (hpc.afterstep)
    host.parent.mkdir(parents=True, exist_ok=True)  # before srun: the ranks write into it
    # without the allocation's shape (herealloc.step_env): srun takes this step's from its command line;
    # a port per step: steps side by side on one node must not share a rendezvous port
    env = {**step_env(os.environ), INTERACTIVE_ENV: "1", hostact.ENV: str(host),
           "HPC_MASTER_PORT": str(master_port_for(str(int(alloc.job_id) * 64 + seq)))}
    print(f"stage {task_key(job.stage, item)}: {task_id} on allocation {alloc.job_id} (step {name})", flush=True)
    logs = str(folder / task_id)
    # its own session: the terminal's Ctrl-C reaches this process only, which stops the step gently
    proc = subprocess.Popen(step_argv(job, alloc, logs, str(pickle_path), setup, name), env=env,
                            start_new_session=True, stderr=subprocess.PIPE)
    step = Step(job, item, task_id, proc, host=str(host), name=name, logs=logs)
    step.relay = threading.Thread(target=_relay, args=(step,), daemon=True)
    step.relay.start()
    return step


def _relay(step: Step) -> None:
    """srun's own messages (a step it could not create, a task that exited) as they come, kept too."""
    assert step.proc.stderr is not None
    for raw in iter(step.proc.stderr.readline, b""):
        line = raw.decode(errors="replace")
        step.said.append(line.strip())
        sys.stderr.write(line)
        sys.stderr.flush()


def serve(step: Step, alloc: Allocation, got: str = "") -> None:
    """Answer what the ranks of `step` asked the host (hpc.recovery.hostact), as hpc.afterstep does for a
    batch job: one listing of their folder (never a stat of a name: hpc.fs.sharedfs). A stop request is
    answered with what stopped the step (herestop.stopped; `got`: the signal this command got), never a
    requeue; one not readable yet is looked at again at the next listing."""
    names = sharedfs.listed(os.path.dirname(step.host))

    def read() -> Mapping[str, str]:
        try:
            return scheduler.job_info(alloc.job_id)
        except RuntimeError:  # the rank keeps its fallback deadline; a stop is told what this command knows
            return {}
    try:  # an answer not written leaves the rank to its fallback (hpc.recovery.hostact), never ends the run
        if hostact.END_ASK in names:  # a `run` stage's rank 0 at a stop: its deadline is the allocation's end
            hostact.answer_end(step.host, read)
        request = hostact.pending(step.host) if hostact.REQUEST in names else None
        if request is not None:
            outcome = herestop.stopped(request, alloc.job_id, read(), got)
            hostact.done(step.host, outcome)
            print(f"stage {task_key(step.job.stage, step.item)}: {outcome['why']}", file=sys.stderr, flush=True)
    except OSError as err:
        print(f"[hpc] step {step.task_id}: its ranks' question not answered: {err}", file=sys.stderr, flush=True)


def _report(step: Step, run: RunDir) -> bool:
    """Whether the task of `step` left its done marker, said in a line; a task that left no result
    either gets srun's words as its error (_no_result)."""
    key = task_key(step.job.stage, step.item)
    if run.is_done(step.job.stage, step.item):
        print(f"stage {key}: done", flush=True)
        return True
    if step.relay is not None:
        step.relay.join(timeout=5)  # srun has ended: its last words are in the pipe
    _no_result(step)
    how = "stopped" if step.stopped else f"failed (srun exited {step.proc.returncode})"
    print(f"stage {key}: {how}; its log: python -m hpc.logs {run.path} --err", flush=True)
    return False


def _no_result(step: Step) -> None:
    """A step that ended with no result from rank 0 (srun refused the step, a setup line failed, a rank
    was killed first): its error result and rank 0's error log say what srun said, so hpc.status reads
    FAILED and why, not UNKNOWN."""
    result = Path(herestep.result_path(step.logs))
    if result.name in sharedfs.listed(result.parent):
        return
    errors = [line.partition("error: ")[2] for line in step.said if "error: " in line]
    why = f"srun exited {step.proc.returncode} with no result from the task: " + (
        (errors or [line for line in step.said if line] or ["nothing said"])[-1])
    herestep.write_outcome(str(result), ("error", "\n".join([*step.said, why])))
    with open(f"{step.logs}_0_log.err", "a") as log:
        log.write(f"[hpc] {why}\n")
