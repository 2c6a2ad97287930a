"""`--cluster here`: a run's stages as srun steps of the allocation this shell is in (salloc).

    salloc -N 2 --ntasks-per-node=2 --gres=gpu:2
    python -m hpc.submit langsplat --profile sandbox --levels 1 --cluster here --run-dir runs/dev

The plan is the batch submission's (hpc.pipeline.plan, with SLURM's ranks per job), and so are the
run directory, the code snapshot, the manifest, the done markers and the checkpoints: only the
launch differs. Stages run one after another in plan order; a stage's tasks run side by side as far
as the allocation's nodes hold them (`srun --exact`), each task one step, named `hpc-<stage>`, whose
ranks run hpc.pipeline.herestep. No sbatch: `sacct -j $SLURM_JOB_ID` lists the steps.

Ctrl-C (SIGINT to this process; srun is kept out of the terminal's process group) sends SIGTERM to
the running steps' tasks with `scancel --signal=TERM JOB.STEP`, as a preemption would: the stage
saves its checkpoint and stops, never requeued (stopsignal.INTERACTIVE_ENV, read by
hpc.recovery.preemption), and this process raises KeyboardInterrupt. The same command again skips
the tasks with a done marker and resumes the interrupted one from its checkpoint. A second Ctrl-C
ends the steps at once (hpc.pipeline.herestop). A stage asking for more nodes, GPUs or CPUs per node than
the allocation has is refused before anything runs (check_fits), with both sets of numbers.

A stage with a container section runs its ranks in the image as a batch job's do: step_argv adds
container.launch()'s srun options and interpreter (hpc carried in included), and its shell lines run on
the host, before srun. What a rank asks the host (hpc.recovery.hostact: HPC_HOST_ACTS names a folder per
step) this process answers while the step runs (serve): the allocation's EndTime, a `run` stage's stop
deadline; a stop request, which is never a requeue here. So a rank inside or outside an image needs no
SLURM client, and stops and resumes the same way.
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from hpc.config.checks import ConfigError
from hpc.fs import sharedfs
from hpc.pipeline import container
from hpc.pipeline.herestop import Interrupt, Reaper
from hpc.pipeline.plan import JobSpec, Plan
from hpc.recovery import hostact
from hpc.recovery.stopsignal import INTERACTIVE_ENV
from hpc.rundir import logdirs
from hpc.rundir.run import RunDir, task_key
from hpc.runtime.distenv import master_port_for
from hpc.slurm import noderange, scheduler

HERE = "here"  # the executor kind, in the config (cluster.kind) and in the manifest
WAIT_SLICE_S = 0.2  # polls of the running steps: a Ctrl-C is acted on within one slice


@dataclass(frozen=True)
class Allocation:
    """What the enclosing allocation holds, per node (scontrol's TRES, spread evenly over its nodes)."""

    job_id: str
    nodes: int
    cpus_per_node: int
    gpus_per_node: int

    @classmethod
    def from_info(cls, job_id: str, info: Mapping[str, str]) -> "Allocation":
        """From `scontrol -o show job` fields: NumNodes, TRES=cpu=4,node=2,gres/gpu=4."""
        tres = dict(p.split("=", 1) for p in info.get("TRES", "").split(",") if "=" in p)
        nodes = int(info.get("NumNodes", "1").split("-")[0] or 1)
        cpus = int(tres.get("cpu") or info.get("NumCPUs", "0") or 0)
        return cls(str(job_id), nodes, cpus // nodes, int(tres.get("gres/gpu", "0") or 0) // nodes)

    def show(self) -> str:
        return (f"{self.nodes} node(s) x {self.gpus_per_node} GPU(s) x {self.cpus_per_node} CPU(s) "
                f"per node")


def current(env: Mapping[str, str] = os.environ) -> Allocation:
    """The allocation of this shell (SLURM_JOB_ID), as SLURM holds it now."""
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id:
        raise ConfigError("--cluster here runs the stages inside an allocation, and SLURM_JOB_ID is not set. "
                          "HINT: salloc -N 2 --ntasks-per-node=2 (with --gres=gpu:N for GPU stages), then run "
                          "this command in its shell.")
    try:
        info = scheduler.job_info(job_id)
    except RuntimeError as err:
        raise ConfigError(f"allocation {job_id} (SLURM_JOB_ID) could not be read: {err}. HINT: run inside "
                          "a live salloc shell, or unset a stale SLURM_JOB_ID.") from None
    return Allocation.from_info(job_id, info)


def need(job: JobSpec, alloc: Allocation) -> Dict[str, int]:
    """What one task of `job` takes: nodes (the most of a node range that fit), GPUs and CPUs per node."""
    lo, hi = noderange.bounds(job.resources["nodes"])
    res = job.resources
    return {"nodes": lo if lo > alloc.nodes else min(hi, alloc.nodes), "gpus": int(res["gpus_per_node"] or 0),
            "cpus": int(res["tasks_per_node"]) * int(res["cpus_per_task"] or 1)}


def check_fits(jobs: Sequence[JobSpec], alloc: Allocation) -> None:
    """ConfigError naming the first stage one of whose tasks does not fit in the allocation."""
    for job in jobs:
        n = need(job, alloc)
        if n["nodes"] > alloc.nodes or n["gpus"] > alloc.gpus_per_node or n["cpus"] > alloc.cpus_per_node:
            raise ConfigError(
                f"stage {job.stage} asks for {n['nodes']} node(s) x {n['gpus']} GPU(s) x {n['cpus']} CPU(s) per "
                f"node; allocation {alloc.job_id} has {alloc.show()}. HINT: salloc -N {n['nodes']} "
                f"--gres=gpu:{n['gpus']} --ntasks-per-node={job.resources['tasks_per_node']} (or more), or "
                f"lower stages.{job.stage}.nodes / gpus_per_node / tasks_per_node.")


def as_steps(plan: Plan, alloc: Allocation) -> Plan:
    """The batch plan as this mode runs it: checked against the allocation, with its srun lines."""
    check_fits(plan.jobs, alloc)
    lines = [f"every stage runs as srun steps of allocation {alloc.job_id} ({alloc.show()}), one stage "
             "after another; Ctrl-C checkpoints and stops, the same command resumes"]
    lines += [f"stage {job.label}: {shlex.join(step_argv(job, alloc, '<logs>', '<task.pkl>'))} "
              f"({min(width(job, alloc), len(job.items))} task(s) side by side)" for job in plan.jobs]
    return dataclasses.replace(plan, kind=HERE, notes=plan.notes + tuple(lines))


def width(job: JobSpec, alloc: Allocation) -> int:
    return max(1, alloc.nodes // need(job, alloc)["nodes"])


def srun_argv(job: JobSpec, alloc: Allocation, logs: str) -> List[str]:
    """One task's step: its share of the allocation only (--exact), its logs where hpc.status reads them."""
    n = need(job, alloc)
    argv = ["srun", f"--job-name=hpc-{job.stage}", f"--nodes={n['nodes']}",
            f"--ntasks-per-node={job.resources['tasks_per_node']}",
            f"--cpus-per-task={job.resources['cpus_per_task'] or 1}", "--exact", "--kill-on-bad-exit=1",
            f"--output={logs}_%t_log.out", f"--error={logs}_%t_log.err"]
    if n["gpus"]:
        argv.append(f"--gpus-per-node={n['gpus']}")
    return argv


def step_argv(job: JobSpec, alloc: Allocation, logs: str, pickle: str, setup: Sequence[str] = ()) -> List[str]:
    """The whole command of one task's step: srun and what each rank runs (hpc.pipeline.herestep), in
    the stage's container as its batch job's srun line has it (container.launch: one builder for both).
    `setup` (cluster.setup) runs in each rank before the task, or, with a container, on the host
    before srun as in a batch script, after the container's own lines (its `env`)."""
    box = job.resources.get("container")
    task = ["-u", "-m", "hpc.pipeline.herestep", pickle]
    if not box:
        rank = [sys.executable, *task]
        if setup:  # what a batch script runs before srun, here in each rank before the task
            rank = ["bash", "-c", "; ".join(setup) + '; exec "$@"', "bash", *rank]
        return srun_argv(job, alloc, logs) + rank
    inside = container.launch(box, job.resources["gpus_per_node"])
    argv = srun_argv(job, alloc, logs) + list(inside.srun_args) + shlex.split(inside.python) + task
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


def run_plan(plan: Plan, run: RunDir, setup: Sequence[str] = (), code: Any = None, run_id: str = "",
             alloc: Optional[Allocation] = None) -> Dict[str, List[str]]:
    """Run every job of the plan as steps of the allocation, in order; returns stage -> task ids.
    Raises KeyboardInterrupt after a Ctrl-C, once the running steps have stopped."""
    from hpc.pipeline.executor import StageTask, _dumps  # the task's modules: only once something runs

    alloc = alloc or current()
    seq = sum(j["executor"] == HERE for t in run.tasks() for j in t["jobs"])
    ids: Dict[str, List[str]] = {}
    failed: List[str] = []
    running: List[Step] = []
    for line in container.prepare(plan.jobs):  # the copy of hpc the containers' srun lines name
        print(line, flush=True)
    served = 0.0
    with Interrupt() as stop, Reaper(running):
        for job in plan.jobs:
            if failed or stop.asked:
                if failed:
                    print(f"stage {job.stage}: not started, an earlier stage failed (python -m hpc.status {run.path})")
                break
            todo = list(zip(job.items, job.indices))
            while todo or running:
                while todo and len(running) < width(job, alloc) and not stop.asked:
                    (item, index), seq = todo.pop(0), seq + 1
                    task = StageTask(str(run.path), job.stage, job.target, item, index, code=code, run_id=run_id)
                    running.append(_launch(job, item, f"{alloc.job_id}.h{seq}", _dumps(task), run, alloc, setup,
                                           code))
                    ids.setdefault(job.stage, []).append(running[-1].task_id)
                todo = [] if stop.asked else todo
                time.sleep(WAIT_SLICE_S)
                stop.act(running, alloc)
                if time.monotonic() - served >= hostact.POLL_S:  # one listing a second per step, as hpc.afterstep
                    served = time.monotonic()
                    for step in running:
                        serve(step, alloc)
                for step in [s for s in running if s.proc.poll() is not None]:
                    running.remove(step)
                    failed += [] if _report(step, run) else [step.task_id]
    if stop.asked:
        print(f"interrupted: the stopped tasks saved their checkpoints; the same command resumes them "
              f"(python -m hpc.status {run.path})", file=sys.stderr, flush=True)
        raise KeyboardInterrupt
    return ids


def _launch(job: JobSpec, item: Any, task_id: str, pickled: bytes, run: RunDir, alloc: Allocation,
            setup: Sequence[str], code: Any) -> Step:
    folder = Path(logdirs.expand(job.folder, task_id))
    folder.mkdir(parents=True, exist_ok=True)
    pickle_path = folder / f"{task_id}_task.pkl"
    pickle_path.write_bytes(pickled)
    run.record_all(job.stage, [(item, task_id)], HERE, code=code.hash if code else None)
    seq = int(task_id.rpartition(".h")[2])
    host = run.path / hostact.FOLDER / f"{task_id}-0" / hostact.REQUEST  # hpc.afterstep.request_path's layout
    host.parent.mkdir(parents=True, exist_ok=True)  # before srun: the ranks write into it
    # a port per step: steps side by side on one node must not share a rendezvous port
    env = {**os.environ, INTERACTIVE_ENV: "1", hostact.ENV: str(host),
           "HPC_MASTER_PORT": str(master_port_for(str(int(alloc.job_id) * 64 + seq)))}
    print(f"stage {task_key(job.stage, item)}: {task_id} on allocation {alloc.job_id}",
          flush=True)
    # its own session: the terminal's Ctrl-C reaches this process only, which stops the step gently
    proc = subprocess.Popen(step_argv(job, alloc, str(folder / task_id), str(pickle_path), setup), env=env,
                            start_new_session=True)
    return Step(job, item, task_id, proc, host=str(host))


def serve(step: Step, alloc: Allocation) -> None:
    """Answer what the ranks of `step` asked the host (hpc.recovery.hostact), as hpc.afterstep does for a
    batch job: one listing of their folder (never a stat of a name: hpc.fs.sharedfs)."""
    names = sharedfs.listed(os.path.dirname(step.host))
    try:  # an answer not written leaves the rank to its fallback (hpc.recovery.hostact), never ends the run
        if hostact.END_ASK in names:  # a `run` stage's rank 0 at a stop: its deadline is the allocation's end
            def read() -> Mapping[str, str]:
                try:
                    return scheduler.job_info(alloc.job_id)
                except RuntimeError:  # the rank keeps its fallback deadline
                    return {}
            hostact.answer_end(step.host, read)
        if hostact.REQUEST in names:  # a step is never requeued: the same command resumes it
            hostact.done(step.host, {"requeue": False, "kind": "interrupted",
                                     "why": "stopped by Ctrl-C (--cluster here). HINT: run the same command "
                                            "again to resume from this checkpoint"})
    except OSError as err:
        print(f"[hpc] step {step.task_id}: its ranks' question not answered: {err}", file=sys.stderr, flush=True)


def _report(step: Step, run: RunDir) -> bool:
    """Whether the task of `step` left its done marker, said in a line."""
    key = task_key(step.job.stage, step.item)
    if run.is_done(step.job.stage, step.item):
        print(f"stage {key}: done", flush=True)
        return True
    how = "stopped" if step.stopped else f"failed (srun exited {step.proc.returncode})"
    print(f"stage {key}: {how}; its log: python -m hpc.logs {run.path} --err", flush=True)
    return False


