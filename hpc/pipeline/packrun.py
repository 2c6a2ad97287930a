"""The job side of a packed stage: each item of the job's group as its own srun step, one requeue for all.

    PYTHON -u -m hpc.pipeline.packrun RUN_DIR [--tasks FILE] -- srun ARGS...   # what `srun` means in a packed job
    PYTHON -u -m hpc.pipeline.packrun --item N PICKLE                         # one item's step, each of its ranks

A packed job (hpc.pipeline.packing) pickles one PackTask: its group's StageTasks. Its batch script
runs this driver where other jobs run hpc.afterstep; the driver reads the pickle where submitit's
runner would (an array's, unpacked from its tasks file first: hpc.pipeline.arraytasks) and starts,
side by side, one `srun --exact` step per item without a done marker (an item done in an earlier
attempt is not run again), each of the item's shape (HPC_PACK: GPUs, ranks, CPUs, memory), with its
own logs (<logs>/<job>.item-<item>_<rank>_log.out|err), master port and stop-request file. Each step runs its
item's StageTask, as an unpacked job's ranks do: its task dir, rank environment, checkpoints,
TensorBoard run and done marker are the item's own (a sweep's packed points: each in its own point's
run directory, its log <job>.item-<point>[-<item>]: hpc.rundir.sweepdir.item_log). Submitit's runner is not in the steps, so its
own requeue never fires per item.

A preemption (SIGTERM) or the time-limit signal reaches every step: each item's rank 0 stops at its
own agreed step, checkpoints and asks its host (hpc.recovery.hostact) for the requeue. The driver is
that host for every item (packstop): once each running item has asked or ended (or SETTLE_WAIT_S
after the first asked), the first request is carried out as an unpacked job's would be (one
`scontrol requeue`, its history recorded), and every other item is answered with the same outcome,
recorded in its own history: the job is requeued once. The requeued job runs only the unfinished
items, each resuming from its own checkpoint. Items without hpc's loop end at the SIGTERM without
asking: once every step has ended, where SLURM shows the job preempted, the driver asks for them
(packstop.Host.stand_in), and the job is requeued once all the same.

An item whose step fails while the job runs is first offered a restart in place (packretry: its step
alone started again, resuming from its own checkpoint, as hpc.recovery.inplace allows); its ranks'
error waits in its request folder meanwhile and is told once it is left failed. Then
stages.X.pack_fail: `continue` (an item that fails leaves its siblings running), or `stop` (its
siblings' steps are ended: srun's double interrupt). The driver exits 0 when every item it ran is
done, 1 otherwise; python -m hpc.status shows each item with the job they shared.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from hpc.pipeline import packing, packretry, packstop
from hpc.rundir import notify

POLL_S = 0.5  # how often the steps are looked at, and (every second look) their request folders


class PackTask:
    """What submitit pickles for a packed job: its group's StageTasks, run by this module's driver."""

    def __init__(self, tasks: Sequence[Any]):
        self.tasks = list(tasks)

    def __call__(self) -> Any:
        raise RuntimeError("a packed job's task runs under python -m hpc.pipeline.packrun, not submitit's runner; "
                           "expected its batch script's srun to be the pack's driver. HINT: resubmit the stage.")


def grouped(job: Any, tasks: Sequence[Any]) -> List[PackTask]:
    """A packed job's tasks (one StageTask per item, in job.items' order) as one PackTask per group."""
    at = iter(tasks)
    return [PackTask([next(at) for _ in group]) for group in job.groups]


def pickle_path(options: Dict[str, str], srun_argv: Sequence[str], environ: Dict[str, str]) -> str:
    """Where this job's PackTask is: an array task's unpacked from its tasks file, else submitit's own."""
    if "--tasks" in options:  # here, not at the top: the driver starts in every packed job's batch step
        from hpc.pipeline import arraytasks

        return arraytasks.unpack(options["--tasks"], environ)
    from submitit.core import utils  # submitit's own path of the job's pickle

    return str(utils.JobPaths(srun_argv[-1], job_id=environ["SLURM_JOB_ID"]).submitted_pickle)


def load(path: str) -> PackTask:
    from submitit.core.utils import DelayedSubmission

    return DelayedSubmission.load(path).function


def item_argv(shape: Dict[str, Any], n: int, pickle: str, log: str) -> List[str]:
    """One item's step: its own GPUs, ranks, CPUs and memory out of the job's (--exact); its ranks in the
    stage's container where it has one (the shape's srun options and interpreter)."""
    argv = ["srun", "--exact", "--nodes=1", f"--ntasks={shape['ranks']}", f"--cpus-per-task={shape['cpus']}",
            "--kill-on-bad-exit=1", "--unbuffered", f"--output={log}_%t_log.out", f"--error={log}_%t_log.err"]
    argv += [f"--gres=gpu:{shape['gpus']}"] * bool(shape["gpus"]) + [f"--mem={shape['mem']}"] * bool(shape["mem"])
    python = shlex.split(shape["python"]) if shape.get("python") else [sys.executable]  # in the stage's container
    return [*argv, *shape.get("srun_args", ()), *python, "-u", "-m", "hpc.pipeline.packrun", "--item", str(n), pickle]


def item_env(environ: Dict[str, str], request: str, n: int, in_place: int = 0) -> Dict[str, str]:
    """A step's environment: without the job's SLURM_GPUS_PER_NODE (with it, every step gets all the
    job's GPUs: hpc.pipeline.packing), its own stop-request file and master port, its restart in place,
    and the folder where a failing rank's error waits (told once the item is not restarted: packretry)."""
    # here, not at the top: only the driver derives ports
    from hpc.recovery.inplace import ENV as IN_PLACE
    from hpc.runtime.distenv import PORT_BASE, PORT_SPAN, master_port_for

    env = {k: v for k, v in environ.items() if k != "SLURM_GPUS_PER_NODE"}
    port = PORT_BASE + (master_port_for(environ.get("SLURM_JOB_ID", "0")) - PORT_BASE + 1 + n) % PORT_SPAN
    return {**env, packstop.HOST_ACTS: request, "HPC_MASTER_PORT": str(port), IN_PLACE: str(in_place),
            notify.HOLD_ENV: os.path.dirname(request)}


def drive(run_dir: str, pack: PackTask, pickle: str, shape: Dict[str, Any], environ: Dict[str, str]) -> int:
    """Every item not done as its own step, side by side; their stops settled as one; 0 when all are done."""
    from hpc.rundir import sweepdir  # here: --item's ranks need none of it
    from hpc.rundir.run import RunDir
    from hpc.slurm import scheduler

    def done(task: Any) -> bool:  # a sweep's packed points: each its own run directory
        return RunDir(task.run_dir).is_done(task.stage, task.item)

    sweep = sweepdir.is_sweep(run_dir)
    todo = [(n, t) for n, t in enumerate(pack.tasks) if not done(t)]
    skipped = len(pack.tasks) - len(todo)
    print(f"[hpc] packed job: {len(todo)} item(s) to run, {skipped} done already", file=sys.stderr, flush=True)
    logs = os.path.dirname(pickle)
    key = scheduler.running_job(environ) or "0"  # an array task as J_T: see hpc.slurm.jobcontrol.running_job
    host = packstop.Host(run_dir, key, environ.get("SLURM_RESTART_COUNT") or "0")
    steps: Dict[int, subprocess.Popen] = {}
    started: Dict[int, float] = {}

    def start(n: int, task: Any, in_place: int = 0) -> None:
        request = host.add(n, in_place)
        point = os.path.basename(task.run_dir) if sweep else None
        log = os.path.join(logs, sweepdir.item_log(key, task.item, point))
        started[n] = time.time()
        steps[n] = subprocess.Popen(item_argv(shape, n, pickle, log), env=item_env(environ, request, n, in_place))
        print(f"[hpc] item {task.item}{f' of point {point}' if point else ''} (stage {task.stage}): step started"
              f"{f' again (restart in place {in_place})' if in_place else ''}, log {log}_0_log.out", file=sys.stderr,
              flush=True)

    for n, task in todo:
        start(n, task)
    codes: Dict[int, int] = {}
    again: Dict[int, int] = {}  # item position -> its restarts in place
    halted: set = set()  # items whose steps pack_fail=stop ended: never restarted
    ending = ""  # SLURM's stop of the job, once an item's failure found it: not asked again
    looks = 0
    while len(codes) < len(steps) or host.waiting():
        time.sleep(POLL_S)
        for n, proc in list(steps.items()):
            if n not in codes and proc.poll() is not None:
                codes[n] = proc.returncode
                task = pack.tasks[n]
                if proc.returncode == 0 or host.asked(n) or n in halted or done(task):
                    continue
                ok, why = (False, ending) if ending else packretry.offer(
                    RunDir(task.run_dir).task_dir(task.stage, task.item), key, environ, started[n], host.paths[n])
                ending = why if why.startswith(packretry.ENDING) else ""
                print(f"[hpc] item {task.item} failed: {'' if ok else 'not restarted in place: '}{why}",
                      file=sys.stderr, flush=True)
                if ok:
                    again[n] = again.get(n, 0) + 1
                    del codes[n]
                    start(n, task, again[n])
                    continue
                notify.told_failures(os.path.dirname(host.paths[n]))  # its ranks' errors, held while it could restart
                if shape["fail"] == "stop":
                    halted.update(stop_siblings(steps, codes, task.item))
        looks += 1
        if looks % 2 == 0 or len(codes) == len(steps):
            if len(codes) == len(steps) and not (host.said or host.stood_in):  # unfinished items that did not ask
                left = [(n, t) for n, t in todo if not done(t) and not host.asked(n)]
                for n, task in left if left and host.preempted() else ():
                    host.stand_in(n, str(RunDir(task.run_dir).task_dir(task.stage, task.item)))
            host.look(running=[n for n in steps if n not in codes])
    finished = [n for n, t in todo if done(t)]
    print(f"[hpc] packed job: {len(finished)} of {len(todo)} item(s) done" + (f"; {host.said}" if host.said else ""),
          file=sys.stderr, flush=True)
    return 0 if len(finished) == len(todo) else 1


def stop_siblings(steps: Dict[int, subprocess.Popen], codes: Dict[int, int], item: Any) -> List[int]:
    """stages.X.pack_fail=stop: end the other items' steps (srun's double interrupt ends a step); the
    positions of those it ends."""
    print(f"[hpc] item {item} failed; pack_fail=stop: ending its siblings' steps", file=sys.stderr, flush=True)
    ending = [n for n, proc in steps.items() if n not in codes and proc.poll() is None]
    for _ in range(2):
        for n, proc in steps.items():
            if n not in codes and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
    return ending


def run_item(n: int, pickle: str) -> int:
    """One rank of item n's step: the item's StageTask, as an unpacked job's rank runs it."""
    print(f"[hpc] packed item {n}: step {os.environ.get('SLURM_STEP_ID')} rank {os.environ.get('SLURM_PROCID')} "
          f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}", flush=True)
    load(pickle).tasks[n]()
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 3 and args[0] == "--item":
        return run_item(int(args[1]), args[2])
    options: Dict[str, str] = {}
    while len(args) > 3 and args[1] == "--tasks":
        options[args[1]] = args[2]
        del args[1:3]
    if len(args) < 3 or args[1] != "--" or packing.PACK_ENV not in os.environ:
        print("usage: python -m hpc.pipeline.packrun RUN_DIR [--tasks FILE] -- srun ARGS... (in a packed job's "
              f"batch script, which sets {packing.PACK_ENV})", file=sys.stderr)
        return 2
    environ = dict(os.environ)
    signal.signal(signal.SIGTERM, lambda *_: None)  # a stop: the steps stop, this driver settles their requests
    pickle = pickle_path(options, args[2:], environ)
    return drive(args[0], load(pickle), pickle, json.loads(environ[packing.PACK_ENV]), environ)


if __name__ == "__main__":
    sys.exit(main())
