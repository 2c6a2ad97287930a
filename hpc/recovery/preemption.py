"""A stop carried out: SLURM asked, its verdict recorded, the job requeued or ended; the stop
signals come from hpc.recovery.stopsignal, the verdict's table from hpc.recovery.verdict.

Usage (what hpc.trainloop does for you)::

    with StopFlag() as flag:                       # USR2 = time limit near, TERM = preempted
        vote = StopVote(flag, device=s.device)
        for step in ...:
            train_step()
            request = vote.poll()                  # collective: every rank, at the same steps
            if request:
                store.save(step, state, blocking=True)
                decision = preemption.handle_stop(request, history=ckpt_dir / "requeue.json")
                preemption.exit_for(decision)      # SystemExit after a requeue, error if none
        vote.close()
    # the handlers that were there before are back

Submit with ``--signal=USR2@<seconds>`` (submitit: ``slurm_signal_delay_s``) and ``--requeue``.
USR2, not USR1: NCCL may catch USR1. Handlers only set a flag; the work happens at a step
boundary, where a MAX all-reduce makes every rank stop at the same step (Lightning deadlocked when
only some ranks saw SIGTERM). The all-reduce is asynchronous and read one poll later, so no poll
waits for the device (see StopVote). Whether the job was preempted or is timing out is read from
SLURM's job state, not guessed from elapsed time as submitit does.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from hpc.config import defaults
from hpc.fs import atomic
from hpc.recovery import hostact, requeue
from hpc.recovery.stopsignal import (  # noqa: F401
    DEFAULT_TIMEOUT_SIGNAL,
    INTERACTIVE_ENV,
    PREEMPT_SIGNAL,
    REASON_CODES,
    StopFlag,
    StopRequest,
    StopVote,
    install,
)
from hpc.recovery.verdict import Decision, classify, decide
from hpc.slurm import scheduler

log = logging.getLogger(__name__)
DEFAULT_MAX_TIMEOUTS = defaults.MAX_TIMEOUTS  # for a loop run outside a pipeline, as in its config
INFO_DEADLINE_S = 4.0  # a stop reads SLURM within its grace time (30 s by default): the requeue needs the rest


def job_info(job_id: str, runner: Callable[..., Any] = subprocess.run, tries: int = 3) -> dict[str, str]:
    """hpc.slurm.scheduler.job_info (JobState, PreemptTime, ...), or {} when SLURM cannot say: the signal
    then decides. An scontrol that exits non-zero is asked again: while a step is being ended (time
    limit, requeue) slurmstepd signals every process of the step, and an scontrol started then can
    die of it (no stderr). A controller that does not answer is asked again for INFO_DEADLINE_S."""
    for attempt in range(1, tries + 1):
        try:
            return scheduler.job_info(job_id, runner=runner, deadline_s=INFO_DEADLINE_S)
        except scheduler.SlurmExit as err:
            log.warning("try %d of %d: %s", attempt, tries, err)
            if requeue.no_answer(str(err)):  # asked again already, for as long as a stop can spare
                return {}
            time.sleep(0.2 * attempt)
        except RuntimeError as err:  # scontrol could not run or gave no answer in time
            log.warning("could not ask SLURM about job %s: %s", job_id, err)
            return {}
    return {}


def load_history(path: Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {"timeouts": 0, "preemptions": 0, "events": []}


def record(path: Path, history: dict[str, Any], decision: Decision, info: dict[str, str],
           at: float | None = None, slurm: str = "") -> None:
    """Append the stop decided at `at` to the history, once carried out: `decision.requeue` is whether
    the job is queued again, `slurm` what SLURM did (hpc.afterstep adds `next` where it did not)."""
    history["timeouts" if decision.kind == "timeout" else "preemptions"] += decision.kind in (
        "timeout", "preempt")
    history["hangs"] = history.get("hangs", 0) + (decision.kind == "hang")
    history["events"].append({"time": time.time() if at is None else at, "restart": info.get("Restarts"),
                              "state": info.get("JobState"), **asdict(decision), "slurm": slurm})
    atomic.write_text(Path(path), json.dumps(history, indent=1))


def handle_stop(request: StopRequest, history: str | os.PathLike, job_id: str | None = None,
                max_timeouts: int = DEFAULT_MAX_TIMEOUTS,
                runner: Callable[..., Any] = subprocess.run) -> Decision:
    """On one rank only (rank 0; a hang's: the rank that decides): the stop decision. Under hpc's
    srun wrapper (hpc.recovery.hostact: every job hpc submits, in a container or not) this rank
    writes the request, the wrapper on the host reads SLURM, records and requeues (settle), and this
    rank returns what the host did (hpc.recovery.hostact.answer; without an answer, what the table
    predicts from the signal and the history); without the wrapper this rank settles it itself."""
    job_id = job_id or scheduler.running_job()  # J_T in an array: see running_job
    if not job_id:
        return Decision(False, None, "not running under SLURM; nothing to requeue", request.reason)
    # a step of an salloc shell's run (--cluster here) is never requeued, which would end the allocation:
    # the command that runs it, its host, says what stopped it (a hang, the allocation's end, Ctrl-C)
    here = Decision(False, None, "stopped (--cluster here), not requeued. HINT: run the same command again to "
                    "resume from this checkpoint", request.reason) if os.environ.get(INTERACTIVE_ENV) else None
    if here and hostact.ENV not in os.environ:
        return here
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", 0) or 0)
    if hostact.ENV in os.environ:
        past = load_history(Path(history))
        decision = here or decide(request.reason, "for the host to read", past["timeouts"], max_timeouts, "host",
                                  past.get("hangs", 0))
        hostact.ask(os.environ[hostact.ENV], {"reason": request.reason, "history": str(history), "job_id": job_id,
                                              "restart": restarts, "max_timeouts": max_timeouts})
        done = hostact.answer(os.environ[hostact.ENV])
        if done is None:
            log.warning("stop (%s): no answer from the srun wrapper on the host in %g s; acting on the table's "
                        "%s", request.reason, hostact.ANSWER_WAIT_S, decision.why)
            return decision
        if "error" in done:
            return Decision(False, None, f"the host could not carry the stop out: {done['error']}", request.reason)
        return Decision(bool(done["requeue"]), done.get("by"), str(done["why"]), done.get("kind", request.reason))
    return settle(request.reason, history, job_id, restarts, max_timeouts, runner)


def settle(reason: str, history: str | os.PathLike, job_id: str, restarts: int,
           max_timeouts: int = DEFAULT_MAX_TIMEOUTS, runner: Callable[..., Any] = subprocess.run,
           avoid: Sequence[str] = ()) -> Decision:
    """Read SLURM's verdict, record it in `history`, requeue if the table says so: where the SLURM
    clients are (the host's srun wrapper, hpc.recovery.nodeaction; or the rank, without one).
    `avoid`: the run's avoid list (hpc.recovery.nodecheck), added to a requeued job's ExcNodeList."""
    info = job_info(job_id, shielded(runner))
    state = info.get("JobState", "UNKNOWN")
    # A job that exits during GraceTime is not requeued by SLURM, even with PreemptMode=REQUEUE
    # (seen on Slurm 22.05): unless SLURM already queued it again, hpc runs scontrol requeue.
    kind, by_slurm = classify(info, reason, restarts)
    evidence = f"{state}, PreemptTime={info.get('PreemptTime', '?')}"
    past = load_history(Path(history))
    decision = decide(kind, evidence, past["timeouts"], max_timeouts, "slurm" if by_slurm else "hpc",
                      past.get("hangs", 0))
    log.warning("stop at SLURM JobState=%s Reason=%s: %s", state, info.get("Reason"), decision.why)
    at, said = time.time(), "nothing asked of SLURM"
    if decision.requeue:  # the record is written once SLURM has answered: it says what SLURM did
        refused, said = requeue_job(job_id, restarts, decision.by == "hpc", runner, requeue.within_grace(info, at),
                                    requeue.adding(info, avoid))
        if refused:
            decision = Decision(False, None, refused, kind)
    record(Path(history), past, decision, info, at, said)
    return decision


def requeue_job(job_id: str, restarts: int, ask: bool = True, runner: Callable[..., Any] = subprocess.run,
                by: float | None = None, exclude: Sequence[str] = ()) -> tuple[str, str]:
    """Requeue the job (`ask`: with scontrol, retried until `by`, hpc.recovery.requeue.until_queued;
    else SLURM already did), give its node range back and set its ExcNodeList to `exclude` where
    given: ('', what SLURM did) once it is queued again, else (SLURM's words with a HINT, what SLURM did)."""
    said = "queued again by SLURM itself"
    if ask:
        by = requeue.within_grace({}) if by is None else by
        seen = requeue.until_queued(lambda run, left: scheduler.requeue(job_id, runner=shielded(run), deadline_s=left),
                                    lambda: _taken(job_id, restarts, requeue.bounded(runner, by)), by, runner)
        if seen:
            hint = NO_ANSWER if requeue.no_answer(seen) else "submit with --requeue and check JobRequeue in slurm.conf"
            return f"{seen} HINT: {hint}", f"not requeued: {seen}"
        said = "queued again by scontrol requeue"
    try:  # SLURM pins the node count it last granted: give a node range back (hpc.recovery.requeue)
        requeue.after_requeue(job_id, exclude)
    except RuntimeError as err:  # the batch script's hpc.afterstep tries again
        log.warning("node range (or ExcNodeList) of job %s not set: %s", job_id, err)
    return "", said


REQUEUE_TRIES = requeue.SIGNAL_TRIES  # an scontrol killed by the job's own stop signals is run this often
NO_ANSWER = ("the controller gave no answer within the job's grace time: see `scontrol ping` and the site's "
             "slurmctld log; resubmit with --run-dir to resume from the checkpoint")


STOP_SIGNALS = {signal.SIGTERM, signal.SIGUSR2, signal.SIGUSR1}


def shielded(runner: Callable[..., Any]) -> Callable[..., Any]:
    """`runner` with this thread's stop signals (SIGTERM, SIGUSR2, SIGUSR1) blocked while it runs.
    A child inherits the signal mask, so the SLURM client it starts cannot die of them halfway;
    for this process they stay pending and reach its handlers as soon as the call returns."""
    def run(*args: Any, **kwargs: Any) -> Any:
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            return runner(*args, **kwargs)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return run


def _taken(job_id: str, restarts: int, runner: Callable[..., Any]) -> bool:
    """Whether SLURM requeued the job although scontrol failed: a requeue ends the job's steps at
    once, and an scontrol run from inside one (the hang watchdog's) can die of that SIGTERM."""
    return classify(job_info(job_id, shielded(runner)), "", restarts)[1]


JobNotRequeued = hostact.JobNotRequeued  # beside the host's answer, which submitit's time-limit path acts on too


def exit_for(decision: Decision) -> None:
    """End this process after a stop: SystemExit when requeued, JobNotRequeued otherwise.

    SystemExit is not an Exception, so submitit writes no result for a requeued job (its client
    keeps waiting for the rerun); JobNotRequeued becomes the job's error result, with the reason.
    """
    if decision.requeue:
        log.warning("exiting for requeue (%s)", decision.why)
        raise SystemExit(-1)
    raise JobNotRequeued(f"job stopped and not requeued: {decision.why}")
