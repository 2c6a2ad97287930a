"""One task of a `--cluster here` run as an srun step of the allocation (hpc.here.backend starts them).

    srun --job-name=hpc-<stage>.<run id>.h<n> --nodes=N --ntasks=T ... python -u -m hpc.here.rank ID_task.pkl

step_argv is a step's whole command: srun with the stage's own numbers (hpc.here.alloc), then what each
rank runs (hpc.here.rank), in the stage's container as its batch job's srun line has it
(hpc.container.spec.launch: one builder for both). start_step writes the task's pickle beside its logs,
records its id, makes its ranks' request folder (hpc.recovery.hostact.request_path) and starts srun in a
session of its own (the terminal's Ctrl-C reaches the command only, which stops the step gently:
hpc.here.stop). While it runs, serve answers what its ranks ask the host: the allocation's EndTime, a
stop request, never a requeue, with what stopped the step. When it ends, report says whether its task
left its done marker; a step that left no result (srun refused it, a setup line failed) gets srun's
words as its error, so hpc.status reads FAILED and why.
"""
from __future__ import annotations

import collections
import os
import shlex
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Deque, List, Mapping, Optional, Sequence

from hpc.container import spec
from hpc.fs import sharedfs
from hpc.here import rank, stops
from hpc.here.alloc import Allocation, srun_argv, step_env
from hpc.pipeline.plan import JobSpec
from hpc.recovery import hostact
from hpc.recovery.stopsignal import INTERACTIVE_ENV
from hpc.rundir import logdirs
from hpc.rundir.run import RunDir, task_key
from hpc.runtime.distenv import master_port_for
from hpc.slurm import scheduler
from hpc.slurm.steps import NAME  # a step's name: its stage, its run's id, its number in the run

SAID = 20  # srun's own last lines kept per step: what it said when a step ends with no result


def step_argv(job: JobSpec, alloc: Allocation, logs: str, pickle: str, setup: Sequence[str] = (),
              name: str = "") -> List[str]:
    """The whole command of one task's step (`name`: NAME's): srun and what each rank runs
    (hpc.here.rank), in the stage's container as its batch job's srun line has it
    (spec.launch: one builder for both). `setup` (cluster.setup) runs in each rank before the
    task, or, with a container, on the host before srun as in a batch script, after the container's
    own lines (its `env`)."""
    box = job.resources.get("container")
    task = ["-u", "-m", "hpc.here.rank", pickle]
    srun = srun_argv(job, alloc, logs, name or NAME.format(stage=job.stage, run="<run id>", seq="<n>"))
    if not box:
        each = [sys.executable, *task]
        if setup:  # what a batch script runs before srun, here in each rank before the task
            each = ["bash", "-c", "; ".join(setup) + '; exec "$@"', "bash", *each]
        return srun + each
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
    name: str = ""  # its SLURM step name (NAME): only this command's steps are signalled (hpc.here.stops)
    logs: str = ""  # its logs' prefix: <folder>/<task id>
    said: Deque[str] = field(default_factory=lambda: collections.deque(maxlen=SAID))  # srun's last lines
    relay: Optional[threading.Thread] = None  # copies srun's own stderr to ours, keeping its last lines


def start_step(job: JobSpec, item: Any, task_id: str, pickled: bytes, run_dir: Path, alloc: Allocation,
               setup: Sequence[str], name: str, record: Callable[[str], None]) -> Step:
    """One task's step: its pickle beside its logs, its id recorded, its ranks' folder made, srun started."""
    folder = Path(logdirs.expand(job.folder, task_id))
    folder.mkdir(parents=True, exist_ok=True)
    pickle_path = folder / f"{task_id}{rank.TASK_SUFFIX}"
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
    answered with what stopped the step (stops.stopped; `got`: the signal this command got), never a
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
            outcome = stops.stopped(request, alloc.job_id, read(), got)
            hostact.done(step.host, outcome)
            print(f"stage {task_key(step.job.stage, step.item)}: {outcome['why']}", file=sys.stderr, flush=True)
    except OSError as err:
        print(f"[hpc] step {step.task_id}: its ranks' question not answered: {err}", file=sys.stderr, flush=True)


def report(step: Step, run: RunDir) -> bool:
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
    result = Path(rank.result_path(step.logs))
    if result.name in sharedfs.listed(result.parent):
        return
    errors = [line.partition("error: ")[2] for line in step.said if "error: " in line]
    why = f"srun exited {step.proc.returncode} with no result from the task: " + (
        (errors or [line for line in step.said if line] or ["nothing said"])[-1])
    rank.write_outcome(str(result), ("error", "\n".join([*step.said, why])))
    with open(f"{step.logs}_0_log.err", "a") as log:
        log.write(f"[hpc] {why}\n")
