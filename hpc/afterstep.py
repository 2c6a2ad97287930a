"""hpc's batch-level wrapper around srun: a node failure is requeued with the failed nodes excluded,
and a node range gets all of its node counts back after any requeue.

    PYTHON -u -m hpc.afterstep RUN_DIR -- srun ARGS...    # what `srun` means in hpc's sbatch scripts
    PYTHON -u -m hpc.afterstep SWEEP_DIR --points FILE -- srun ARGS...   # a sweep's array (FILE: each task's point)
    PYTHON -u -m hpc.afterstep RUN_DIR --tasks FILE -- srun ARGS...  # an array: FILE holds its tasks' pickles

In an array's task it first unpacks the task's pickle from the array's one file (--tasks,
hpc.pipeline.arraytasks) where submitit's runner reads it. Then it runs srun and exits with srun's
status. It acts on the job's SIGTERM and on srun's failure:
- A node failure, a preemption and a requeue each send SIGTERM to every process of the job, this
  one included, and SLURM's SIGKILL follows KillWait seconds later (30 by default). srun itself may
  not return before that: it waits KillWait + 2 s for the steps of a node that died. So this process
  acts on the SIGTERM itself, with SIGTERM ignored meanwhile, which its scontrol calls inherit.
- srun ending with an error on its own (a rank that died, a collective timeout, a lost node, an error
  in the user's code) is looked at once srun has returned: a failure the allocation can recover from
  starts a new srun step in the same job from the newest checkpoint (hpc.recovery.restart, within
  stages.X.max_restarts_in_place), else a node failure is requeued without the node; with spare
  nodes (stages.X.spare_nodes) the steps run on the job's nodes less the spares. An srun that waits
  for a node that is gone (its slurmd lost: SLURM ends the step only SlurmdTimeout later) is ended
  once SLURM shows the node not responding (hpc.recovery.restart.lost), and the step restarts without it.
- A rank's stop decision (a preemption, the time limit: rank 0; a hang: the rank that decides), which
  ranks never carry out themselves under this wrapper, container or not: it makes the attempt's
  folder and names a request file in it in srun's environment (HPC_HOST_ACTS, hpc.recovery.hostact),
  lists the folder every POLL_S (and for AFTER_SRUN_S once srun has ended: the request of a rank on
  another node may reach this node's view of the shared disk after srun's end), requeues the job
  from here and answers the rank with what it did. It also answers a rank's question for the job's
  EndTime (a `run` stage's deadline) there.
What it decides (hpc.recovery.nodeaction), and why, goes to the task's history (hpc.recovery.nodefail,
shown by hpc.status) and to the job's log. The batch script runs on the job's first node, beside rank 0:
if that node is the one that fails, nothing of the job is left to act, and SLURM requeues it (--requeue) as it was.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

# Nothing of hpc at the top but supervise (the standard library alone): this wrapper starts in every batch
# step of every job, and most of them only run srun. What acts on a SIGTERM or a failure (hpc.recovery,
# scheduler calls) is imported then.
from hpc.recovery.supervise import AFTER_SRUN_S, POLL_S, WAIT_SLICE_S, supervise  # noqa: F401


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    options: Dict[str, str] = {}
    while len(args) > 3 and args[1] in ("--points", "--tasks"):
        options[args[1]] = args[2]
        del args[1:3]
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m hpc.afterstep RUN_DIR [--points FILE] [--tasks FILE] -- srun ARGS...", file=sys.stderr)
        return 2
    if "--tasks" in options:
        # here, not at the top: only an array's batch script passes --tasks (and the module is small)
        from hpc.pipeline import arraytasks

        try:  # its pickle where submitit's runner, under srun, reads it
            arraytasks.unpack(options["--tasks"], os.environ)
        except (OSError, arraytasks.TasksFileError) as err:
            print(f"[hpc] this task's pickle is not unpacked, so it cannot run: {err}", file=sys.stderr, flush=True)
            return 1
    points = options.get("--points")
    if os.environ.get("HPC_NODE_CHECK"):  # the stage's node check before any rank starts (hpc.recovery.nodecheck)
        from hpc.recovery import nodecheck

        spare = os.environ.get(SPARE_NODES, "")
        verdict = nodecheck.before_step(args[0], os.environ, resubmit_after, points, int(spare) if spare.isdigit() else 0)
        print(f"[hpc] {verdict.line}", file=sys.stderr, flush=True)
        if not verdict.go:
            return verdict.code
        usable = list(verdict.healthy)
    else:
        usable = []
    # This process calls SLURM only at a stop, within the grace time: a controller that does not answer
    # is asked again for STOP_RETRY_S at most (the requeue itself, until the job's EndTime is near).
    # Its own calls only: resubmit_after's sbatch, and the job it queues, get the user's (submission_env).
    from hpc.slurm.submitenv import own_setting  # here, not at the top, as the rest of hpc

    with own_setting(RETRY_ENV, str(min(STOP_RETRY_S, _seconds(os.environ.get(RETRY_ENV))))):
        return steps(args[0], ["srun", *args[2:]], points, usable)


def steps(run_dir: str, argv: List[str], points: Optional[str], usable: Sequence[str] = ()) -> int:
    """srun, and a new srun step in the same allocation after each failure restarted in place
    (hpc.recovery.restart keeps `state`); the last step's exit status. `usable`: the nodes that passed
    the node check, where it ran (a spare takes a failed node's place)."""
    state: Dict[str, Any] = {"number": 0, "argv": argv, "run_dir": run_dir, "points": points}
    if os.environ.get("HPC_NODE_CHECK"):  # each restarted step's nodes are checked too (restart.checked)
        from hpc.recovery import nodecheck

        state["check"] = lambda nodes: nodecheck.check_before_step(run_dir, nodes, nodecheck.options(os.environ) or {},
                                                                   os.environ)[1]
        state["avoid"] = lambda: nodecheck.avoided(run_dir, os.environ)  # added to a requeue's exclusions
    if os.environ.get(SPARE_NODES, "0") not in ("", "0"):  # trains on the nodes less the spares
        from hpc.recovery import restart  # here, not at the top: only a stage with spare nodes needs it

        argv = restart.first(argv, os.environ, state, usable)
    while True:
        state["env"] = {**os.environ, IN_PLACE: str(state["number"])}
        request = state["request"] = request_path(run_dir, state["env"])
        try:  # before srun: the ranks write into it, and the host lists it (hpc.recovery.hostact)
            os.makedirs(os.path.dirname(request), exist_ok=True)
        except OSError as err:
            print(f"[hpc] cannot make {os.path.dirname(request)} for the ranks' stop requests: {err}. HINT: the "
                  "run directory must be writable from the batch script's node", file=sys.stderr, flush=True)
            return 1
        # srun's, and the ranks': their own retry deadline; where a failing rank's error waits for act()
        env = {**state["env"], HOST_ACTS: request, HOLD_FAILURES: os.path.dirname(request)}
        state.update(started=time.time(), next=None, failing_since=None, unlooked=False)
        code = supervise(argv, lambda why: act(run_dir, why, points, state), lambda: serve(request, state), env,
                         lambda: stuck(state), lambda: termed(request))
        if state["next"] is None:  # the task had finished its work when a rank died (at exit): completed
            return 0 if state.get("finished") else code
        argv, state["number"] = state["next"], state["number"] + 1


RETRY_ENV = "HPC_SLURM_RETRY_S"  # hpc.slurm.retry.DEADLINE_ENV, a literal here as HOST_ACTS is
STOP_RETRY_S = 5.0


def _seconds(text: Optional[str]) -> float:
    try:
        return float(text) if text else STOP_RETRY_S
    except ValueError:
        return STOP_RETRY_S


# hpc.recovery.hostact.ENV (the same name, checked by tests/test_hostact.py): where the deciding rank writes its
# stop request for this wrapper to carry out; a literal here, as nothing of hpc is loaded before it acts
HOST_ACTS = "HPC_HOST_ACTS"
IN_PLACE, SPARE_NODES = "HPC_RESTART_IN_PLACE", "HPC_SPARE_NODES"  # hpc.recovery.inplace's ENV and SPARE_ENV
HOLD_FAILURES = "HPC_HOLD_FAILURES"  # hpc.rundir.notify.HOLD_ENV


def request_path(run_dir: str, environ: Mapping[str, str]) -> str:
    """The stop request file of the attempt running in `environ`, in a folder of its own: one per job
    id, restart count and restart in place (hpc.recovery.hostact.request_path)."""
    from hpc.recovery import hostact  # here, not at the top: the folders' layout, written once there

    in_place = environ.get(IN_PLACE, "0")
    return hostact.request_path(run_dir, environ.get("SLURM_JOB_ID", "0"), (environ.get("SLURM_RESTART_COUNT") or "0")
                                + f".{in_place}" * (in_place not in ("", "0")))


def act(run_dir: str, why: str, points: Optional[str] = None, state: Optional[Dict[str, Any]] = None) -> bool:
    """after_step, with what it did in the job's log; True when it did something. `state`: this
    allocation's srun steps (hpc.recovery.restart), which a SIGTERM never restarts in place."""
    if state is not None and why == "SIGTERM":
        state["terminated"] = True
    try:
        # here, not at the top: only a SIGTERM or a failed srun needs them
        from hpc.recovery import nodeaction
        from hpc.rundir.run import RunDir

        action, line = nodeaction.after_step(RunDir(run_dir), os.environ, resubmit_after,
                                             srun_ended=why != "SIGTERM", points=points, state=state)
    except Exception as err:  # srun's exit status stays the job's: never replace it with ours
        action, line = None, f"nothing done: {type(err).__name__}: {err}"
    if action is None or action.do != "none" or why != "SIGTERM":  # a failed srun: what was done, and why
        print(f"[hpc] {why}: {line}", file=sys.stderr, flush=True)
    if state is not None and why != "SIGTERM" and not state.get("finished") and (action is None or action.do in (
            "none", "stop")):
        from hpc.rundir import notify  # here: only a job that ends failed tells its sinks

        # the ranks' errors, held in the step's folder while a restart in place or a requeue could follow
        notify.told_failures(os.path.dirname(state["request"]))
    return action is not None and action.do != "none"


def termed(request: str) -> bool:
    """Whether a rank's step was sent SIGTERM (its mark beside `request`, hpc.recovery.hostact.mark_step_term)."""
    from hpc.fs import sharedfs  # here, not at the top: asked once, after srun ended
    from hpc.recovery.hostact import STEP_TERM

    return STEP_TERM in sharedfs.listed(os.path.dirname(request))


def stuck(state: Dict[str, Any]) -> bool:
    """Whether srun waits for a node that is gone (hpc.recovery.restart.lost): asked once a rank of its
    step has failed (its error in the step's folder, hpc.rundir.notify) or hung (restarted in place)."""
    try:
        failing = "hang" in state or any(n.startswith("failed-") for n in os.listdir(os.path.dirname(state["request"])))
        if not failing:
            return False
        from hpc.recovery import restart  # here, not at the top: only a failed step asks

        return restart.lost(state, os.environ)
    except Exception as err:  # SLURM gave no answer: srun ends when SLURM says the node is down
        if not state.get("unlooked"):  # said once a step
            print(f"[hpc] the step's nodes not looked at: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        state["unlooked"] = True
        return False


def serve(request: str, state: Optional[Dict[str, Any]] = None) -> bool:
    """One look at the ranks' folder (a listing, never a stat: hpc.fs.sharedfs): settle a request,
    True once one was; answer a question for the job's EndTime, which is not one."""
    from hpc.fs import sharedfs  # here, not at the top: small, and only a job under way polls

    names = sharedfs.listed(os.path.dirname(request))
    if "end.ask" in names:  # hpc.recovery.hostact.END_ASK
        answer_end(request)
    return os.path.basename(request) in names and settle(request, state)


def answer_end(request: str) -> None:
    """Tell the rank that asked (hpc.recovery.hostact.ask_end) the job's EndTime, read from SLURM here."""
    try:
        from hpc.recovery import hostact, preemption  # here: only a `run` stage's stop asks
        from hpc.slurm import scheduler

        hostact.answer_end(request, lambda: preemption.job_info(scheduler.running_job(), tries=1))
    except Exception as err:  # the rank keeps its fallback deadline
        print(f"[hpc] the job's EndTime not told to the ranks: {type(err).__name__}: {err}", file=sys.stderr,
              flush=True)


def settle(request: str, state: Optional[Dict[str, Any]] = None) -> bool:
    """Carry out a rank's stop request (hpc.recovery.hostact), with what was done in the job's log; False
    while it cannot be read (listed, but not readable from this node yet): the next look tries again,
    as the rank waits for an answer. One that was read is settled once, carried out or not."""
    # here, not at the top: only a stop needs them
    from hpc.recovery import hostact, nodeaction

    try:
        if hostact.pending(request) is None:
            return False
    except OSError:
        return False
    try:
        line = nodeaction.settle_request(request, state=state)
    except Exception as err:  # a request that cannot be carried out is said once, not retried
        line = f"the ranks' stop request {request} not carried out: {type(err).__name__}: {err}"
    print(f"[hpc] {line}", file=sys.stderr, flush=True)
    return True


def resubmit_after(job_id: str, run_dir: str, stage: str, exclude: Sequence[str],
                   info: Mapping[str, str]) -> str:
    """Submit (through submitit) the job that resubmits `stage` into `run_dir` once `job_id` has
    ended; returns its id. It runs in this job's partition, account and QOS, from this job's working
    directory, where the pipeline's module is importable, without this job's SLURM_* variables."""
    # here, not at the top: a wrapper that only runs srun never needs them (submitit's executor, whose
    # sbatch is queued once however SLURM answers), hpc.recovery and the scheduler's calls
    from hpc.pipeline.submitonce import SlurmExecutor
    from hpc.recovery import requeue
    from hpc.slurm.submitenv import submission_env

    extra = {"dependency": f"afterany:{job_id}", **{flag: info[key] for key, flag in (
        ("Account", "account"), ("QOS", "qos")) if info.get(key, "") not in requeue.UNSET}}
    executor = SlurmExecutor(folder=f"{run_dir}/{stage}/logs/resubmit-%j")
    partition = {"partition": info["Partition"]} if info.get("Partition", "") not in requeue.UNSET else {}
    executor.update_parameters(job_name=f"hpc-resubmit-{stage}", nodes=1, ntasks_per_node=1, cpus_per_task=1,
                               time=10, additional_parameters=extra, **partition)
    with submission_env():
        return str(executor.submit(resubmit, run_dir, stage, list(exclude)).job_id)


def resubmit(run_dir: str, stage: str, nodes: Sequence[str]) -> None:
    """hpc.submit into `run_dir`, as its first submission named the pipeline, with `nodes` added to
    the stage's excluded nodes (stages.X.extra.exclude, saved in config.yaml for later ones). The
    job resubmit_after submits runs it."""
    # here, not at the top: the wrapper around srun, in every job, never needs the config machinery
    from hpc.config import schema as hconfig
    from hpc.pipeline import plan as hplan
    from hpc.pipeline import submission
    from hpc.rundir.run import RunDir
    from hpc.slurm import hostlist

    run = RunDir(run_dir)
    manifest: Dict[str, Any] = run.manifest()
    spec = manifest.get("pipeline_arg") or manifest["pipeline"]
    pipe = hplan.get_pipeline(spec)
    cfg = hconfig.load(pipe.schema, spec, saved=run.config_path, extra=pipe.templates, settle=pipe.settle)
    key = next(s.resources or s.name for s in pipe.stages(cfg) if s.name == stage)
    before = str(cfg.stages[key].extra.get("exclude") or "")
    exclude = sorted(set(hostlist.expand(before) if before else []) | set(nodes))
    overrides = [f"stages.{key}.extra.exclude={','.join(exclude)}"] if exclude else []
    # the same code as the job it replaces: the run's snapshot, never what the live tree holds now
    submission.start(submission.Request(spec, tuple(overrides), run_dir=run_dir, same_snapshot=True))


if __name__ == "__main__":
    sys.exit(main())
