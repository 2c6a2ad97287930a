"""The picklable stage job and the submitit executor that runs it.

    executor = make_executor("slurm", "runs/x/rgb/logs/%j"); executor.submit(StageTask(...))

StageTask is what submitit pickles: the run directory, the stage name, the array item, a
"module:function" target, where the code snapshot is and the run id; nothing heavy. In every task
it exports the task's variables (HPC_CHECKPOINT_DIR, the tracker ids of hpc.rundir.tracking, the
snapshot's PYTHONPATH), moves into the snapshot (hpc.rundir.snapshot), imports the target from there,
builds a StageContext, calls the target, and rank 0 writes the done marker. A requeued job unpickles
the same task, so it runs the same snapshot; a task whose done marker is written never runs again (a
job requeued or restarted in place after the work was whole returns the recorded result). On SIGUSR2
(time limit near) submitit calls checkpoint(), which resubmits the same task (snapshot included); it
resumes from what the stage saved under its task directory. Preemption (SIGTERM, PreemptMode=REQUEUE)
is requeued by SLURM itself with the same job id. submit_array() submits an array whose task ids are chosen by the plan
(aftercorr after a partial resubmission, hpc.pipeline.arrays), not submitit's 0..n-1. Every sbatch
of either carries a token and is queued once however SLURM answers (hpc.pipeline.submitonce).
"""
from __future__ import annotations

import contextlib
import importlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpc.config import defaults
from hpc.fs import atomic
from hpc.pipeline import arraytasks
from hpc.rundir import logdirs, tracking
from hpc.rundir.run import DONE, RunDir, task_key
from hpc.rundir.snapshot import JobCode
from hpc.rundir.sweepdir import SweepDir, is_sweep


def drop_unexpanded_folder(folder: str) -> None:
    """submitit's local controller creates its folder ('.../logs/%j') before expanding %j (or %A),
    leaving an empty directory literally named so; remove it once the job has ended (rmdir: only if empty)."""
    if logdirs.JOB in folder or logdirs.ARRAY in folder:
        with contextlib.suppress(OSError):
            os.rmdir(folder)


@dataclass
class StageContext:
    """What a stage callable receives."""

    run_dir: Path
    stage_dir: Path  # <run>/<stage>/[task-<item>/]: outputs, checkpoints/, tensorboard/ of this task
    cfg: Dict[str, Any]  # the resolved run config as a plain dict
    stage: str
    task_index: Optional[int]  # position of `item` in the stage's item list
    item: Any  # the array item (e.g. a feature level); None for a single job
    env: Any = None  # hpc.runtime.envparse.DistEnv of this process


class StageTask:
    """`needs`: tasks (stage, item) of the same run that must have their done marker before this one
    runs; a sweep's array waits for the whole previous array to end (afterany), and each task then
    checks its own point's (hpc.sweep.submission)."""

    def __init__(self, run_dir: str, stage: str, target: str, item: Any = None,
                 task_index: Optional[int] = None, needs: Sequence[Tuple[str, Any]] = (),
                 code: Optional[JobCode] = None, run_id: str = ""):
        self.run_dir, self.stage, self.target = run_dir, stage, target
        self.item, self.task_index, self.needs = item, task_index, tuple(needs)
        self.code = code  # the snapshot to import from (hpc.rundir.snapshot); None: the live tree
        self.run_id = run_id  # the manifest's run id (hpc.rundir.tracking)

    def __call__(self) -> Any:
        # the job's own modules, loaded where it runs: a submission pickles tasks without them
        from hpc.config import resolved
        from hpc.recovery import hostact, submitstop
        from hpc.rundir import notify
        from hpc.runtime.envparse import from_environ

        started = time.time()
        run = RunDir(self.run_dir)
        earlier = _done_earlier(run, self.stage, self.item)
        if earlier is not None:  # a requeue or restart of a job whose task had finished its work
            return earlier.get("result")
        missing = [task_key(*k) for k in getattr(self, "needs", ()) if not run.is_done(*k)]  # older pickles: none
        if missing:
            raise RuntimeError(f"{task_key(self.stage, self.item)} did not run: {', '.join(missing)} has no done "
                               f"marker (it failed or was cancelled); expected it finished first. HINT: python -m "
                               f"hpc.status {run.path.parent}, then resubmit the sweep")
        if hostact.ENV in os.environ:  # under hpc's srun wrapper: its requeues, submitit's too, go to the host
            hostact.requeue_on_host()
            hostact.mark_step_term()  # a preempted step that still ends 0 is requeued by the host
        quiet_sigcont()
        dist = _local_env() or from_environ()
        if dist.source != "single":
            dist.export()  # RANK/WORLD_SIZE/MASTER_* for torch.distributed and user code
        stage_dir = run.task_dir(self.stage, self.item)
        stage_dir.mkdir(parents=True, exist_ok=True)
        if dist.rank == 0 and is_sweep(str(run.path.parent)):  # a sweep's point: its logs are the sweep's
            SweepDir(run.path.parent).link_logs(run.path.name, self.stage)  # stage's, linked once, not per point
        # set, not setdefault: sbatch exports the submitting shell's environment, which may carry one
        exported = {"HPC_CHECKPOINT_DIR": str(stage_dir / "checkpoints")}
        run_id, code = getattr(self, "run_id", ""), getattr(self, "code", None)  # older pickles: neither
        if run_id:
            exported.update(tracking.environ(run_id, self.stage, self.item, stage_dir))
        if code is not None:
            exported.update(code.environ(os.environ))
            code.enter()  # before the target is imported: it comes from the snapshot
        os.environ.update(exported)
        # the world the job got, which a node range (sbatch --nodes=MIN-MAX) leaves to the scheduler
        print(f"[hpc] stage {self.stage} item {self.item} rank {dist.rank}/{dist.world_size} "
              f"on {dist.num_nodes} node(s) job {dist.job_id} restart {dist.restart_count}", flush=True)
        module, _, name = self.target.partition(":")
        func = getattr(importlib.import_module(module), name)
        cfg = resolved.read(run.config_path)  # without OmegaConf: see hpc.config.resolved
        if dist.rank == 0:  # a requeue of a stage without hpc's loop (submitit's, SLURM's own): its sinks hear which
            submitstop.on_submitit_requeue(stage_dir, task_key(self.stage, self.item), dist.job_id,
                                           dist.restart_count)
        ctx = StageContext(run.path, stage_dir, cfg, self.stage, self.task_index, self.item, dist)
        try:
            result = func(ctx)
        except Exception as err:  # whichever rank raised: the run's sinks hear of it, once (hpc.rundir.notify)
            notify.failed(stage_dir, task_key(self.stage, self.item), dist.job_id, dist.restart_count,
                          f"{type(err).__name__}: {str(err).strip()[-600:]}", dist.rank,
                          os.environ.get(notify.HOLD_ENV))
            raise
        finally:  # a requeue leaves by SystemExit: the next attempt resumes the same tracker run
            if dist.rank == 0:
                tracking.record(stage_dir)
        if dist.rank == 0:
            run.mark_done(self.stage, self.item, {"started": started, "finished": time.time(), "job_id": dist.job_id,
                                                  "world_size": dist.world_size, "nodes": dist.num_nodes,
                                                  "attempt": _attempt(), "result": result})
            notify.task_done(run.path, self.stage)  # its stage, or the run, completed: told once
        print(f"[hpc] stage {self.stage} item {self.item} rank {dist.rank} finished", flush=True)
        return result

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """Called by submitit on the time-limit signal: requeue a fresh copy of this task."""
        import submitit

        return submitit.helpers.DelayedSubmission(StageTask(
            self.run_dir, self.stage, self.target, self.item, self.task_index, getattr(self, "needs", ()),
            getattr(self, "code", None), getattr(self, "run_id", "")))


# What names one attempt of a task alike on its ranks and differently on its requeues and restarts in place.
ATTEMPT_VARS = ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "SLURM_STEP_ID", "SUBMITIT_LOCAL_JOB_ID")


def _attempt() -> str:
    """This attempt of the task: its job, requeue and step (a restart in place is a new step)."""
    return "/".join(os.environ.get(key, "") for key in ATTEMPT_VARS)


def _done_earlier(run: RunDir, stage: str, item: Any) -> Optional[Dict[str, Any]]:
    """The done marker's record where an earlier attempt wrote it, said in one line; None when there is
    none, or when it is this attempt's own (rank 0 may finish before a slower rank starts). A job
    requeued or restarted after the work was whole (a rank that died at interpreter exit, a preemption
    within the last step) runs nothing again. A marker without an attempt is older than this one."""
    info = run.done_info(stage, item)
    if info is None or info.get("attempt") == _attempt():
        return None
    print(f"[hpc] {task_key(stage, item)} finished already (its done marker {run.task_dir(stage, item) / DONE}, "
          f"written by job "
          f"{info.get('job_id', '?')}): not run again", flush=True)
    return info


def _local_env() -> Any:
    """Under submitit's LocalExecutor, turn its SUBMITIT_LOCAL_* variables into torchrun-style ones."""
    env = os.environ
    if env.get("SUBMITIT_EXECUTOR") != "local" or "SUBMITIT_LOCAL_GLOBALID" not in env:
        return None
    world = env.get("SUBMITIT_LOCAL_NTASKS", "1")
    if world == "1":
        return None
    from hpc.runtime.distenv import master_port_for  # the job's side only, as in StageTask.__call__
    from hpc.runtime.envparse import from_environ

    job_id = env.get("SUBMITIT_LOCAL_JOB_ID", "0")
    mapping = {"RANK": env["SUBMITIT_LOCAL_GLOBALID"], "LOCAL_RANK": env["SUBMITIT_LOCAL_LOCALID"],
               "WORLD_SIZE": world, "LOCAL_WORLD_SIZE": world, "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(master_port_for(job_id if job_id.isdigit() else "0"))}
    return from_environ(mapping)


def submit_array(executor: Any, tasks: Sequence[Any], task_ids: Sequence[int] = (),
                 tasks_file: Optional[str] = None) -> List[Any]:
    """Submit `tasks` as one array through `executor`; tasks[k] runs as array task task_ids[k]
    (() : k; executor's parameters carry the matching --array, hpc.pipeline.sbatch). With
    `tasks_file` (a SLURM array of 2 tasks or more, whose batch script passes it to hpc.afterstep:
    JobSpec.executor_parameters) every task's pickle goes into that one file
    (hpc.pipeline.arraytasks), not one file each; after sbatch the array gets its folder, where
    SLURM opens its tasks' logs (one for all of them: hpc.rundir.logdirs). Without it, submitit's
    executor.batch() pickles each task itself."""
    if tasks_file is None:
        assert not task_ids or list(task_ids) == list(range(len(tasks))) or len(tasks) < 2, task_ids
        with executor.batch():  # one sbatch --array for an array stage
            return [executor.submit(t) for t in tasks]
    import submitit
    from submitit.core import utils

    from hpc.pipeline.submitonce import SlurmExecutor  # its sbatch carries a token: queued once (submitonce)

    task_ids = list(task_ids) or list(range(len(tasks)))
    assert len(task_ids) == len(tasks) == len(set(task_ids)) > 1, (task_ids, len(tasks))
    timeout = (executor.parameters.get("time", 5), executor.max_num_timeout)
    pickles = {}
    for task_id, task in zip(task_ids, tasks):
        delayed = utils.DelayedSubmission(task)
        delayed.set_timeout(*timeout)
        pickles[task_id] = _dumps(delayed)
    pattern = str(utils.JobPaths(executor.folder).submitted_pickle)  # %j left in: the task fills it in
    atomic.write_bytes(tasks_file, arraytasks.encode(pickles, pattern))
    array = SlurmExecutor(executor.folder, executor.max_num_timeout, python=executor.python)
    array.intent = executor.intent  # told the token before sbatch (hpc.pipeline.launcher.Recorder)
    array.update_parameters(**executor.parameters)
    array.parameters["map_count"] = len(tasks)  # the %A_%a log names; an explicit --array line is ours
    first = array._submit_command(array._submitit_command_str)
    folder = str(executor.folder)
    # SLURM opens a task's logs in its folder, and does not create it: one folder for the array
    # (a folder pattern of %A), one per task for a pattern of %j.
    for path in dict.fromkeys(logdirs.expand(folder, f"{first.job_id}_{t}") for t in task_ids):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
    return [submitit.SlurmJob(folder=executor.folder, job_id=f"{first.job_id}_{t}", tasks=list(range(first.num_tasks)))
            for t in task_ids]


def make_executor(kind: str, folder: str, max_timeouts: int = defaults.MAX_TIMEOUTS,
                  python: Optional[str] = None) -> Any:
    """A submitit executor for `kind` (slurm | local | debug); `python`: the srun line's interpreter text
    (a container's, hpc.container.spec; None: this process's)."""
    import submitit

    if kind == "slurm":  # submitit's, each sbatch queued once however SLURM answers (hpc.pipeline.submitonce)
        from hpc.pipeline.submitonce import SlurmExecutor

        return SlurmExecutor(folder=folder, max_num_timeout=max_timeouts, python=python)
    if kind == "local":
        return submitit.LocalExecutor(folder=folder)
    if kind == "debug":
        return submitit.DebugExecutor(folder=folder)
    raise ValueError(f"executor kind {kind!r}; expected slurm, local or debug. "
                     "HINT: resolve 'auto' with hpc.slurm.scheduler.detect() first.")


def _dumps(obj: Any) -> bytes:
    """What DelayedSubmission.dump writes (cloudpickle), by the standard pickler where the two agree
    (3x faster): a StageTask and its items pickled by reference to importable modules. Anything the
    standard pickler refuses (a lambda, a local function), names __main__ (which the job cannot
    import: cloudpickle copies it by value), or that a module registered for by-value pickling may
    hold, goes through cloudpickle as submitit would."""
    import pickle

    import cloudpickle

    if not getattr(cloudpickle.cloudpickle, "_PICKLE_BY_VALUE_MODULES", None):
        try:
            data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            if b"__main__" not in data:
                return data
        except (pickle.PicklingError, AttributeError, TypeError):
            pass
    return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def quiet_sigcont() -> None:
    """SIGCONT back to its default (the process goes on), not submitit's handler, which only logs it.
    SLURM sends SIGCONT with each signal it gives a step, so the two arrive together: where
    submitit's handler of the other (SIGUSR2: the time limit) raises while SIGCONT's is logging,
    logging swallows the error as its own and the task sleeps on into its time limit."""
    import signal

    if signal.getsignal(signal.SIGCONT) not in (signal.SIG_DFL, None):
        signal.signal(signal.SIGCONT, signal.SIG_DFL)
