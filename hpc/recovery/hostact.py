"""Stop decisions carried out on the host: a rank writes what it decided, hpc's srun wrapper acts.

    python -m hpc.afterstep RUN_DIR -- srun ...    # exports HPC_HOST_ACTS=<RUN_DIR>/.host/<job>-<restart>/request.json

Inside a container there is no scontrol, sbatch or srun. So in every job hpc submits, container or
not, the ranks never call SLURM to requeue: the srun wrapper (hpc.afterstep, on the host) names a
request file in srun's environment; the rank that decides a stop (rank 0 at a signal, the rank whose
watchdog claimed a hang's verdict: preemption.handle_stop) writes the request there; the wrapper
sees it within a poll (POLL_S), while srun still runs (a hung rank may never let srun end), and
settles it (hpc.recovery.nodeaction.settle_request): reads SLURM, records the decision in the
history, requeues, gives a node range back, and answers with what it did (.done), which the rank
waits for (answer) and acts on: a requeue that SLURM refused is not taken for one. A loop run under
a srun of the user's own, without the wrapper, has no HPC_HOST_ACTS and settles it in the rank.
A request holds the stop's `reason` (timeout, preempt, hang, or SUBMITIT), the task's requeue
`history`, `job_id`, `restart` and `max_timeouts`; the answer, `requeue`, `why`, `kind` (or `error`).
In a `--cluster here` step the command that runs it is the host (hpc.here): it never
requeues, and answers with what stopped the step, from the reason and the allocation's state.
A rank that needs the job's EndTime (a `run` stage's deadline: hpc.recovery.deadline) asks the host
for it the same way (ask_end, end_fields): no SLURM client in the task.

submitit's own handler of the time-limit signal (a stage with no TrainLoop) would run scontrol
requeue in the task: requeue_on_host(), called by every stage task under the wrapper, sends it here too,
and waits for the answer and acts on it as a TrainLoop's stop does.

The folder is one per attempt (job id and restart count in its name), made by the wrapper before
srun starts; its files are written whole (atomic rename), and the request is renamed to .done once
settled, so an attempt never acts on an earlier attempt's request. Both sides poll by listing the
folder (hpc.fs.sharedfs.listed), never by a stat of a name: on NFS a "no such file" answer is cached
for 30 to 60 s, and the rank that writes may be on another node than the wrapper.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional

from hpc.fs import atomic, sharedfs
from hpc.recovery import deadline

# the request file of this attempt; set only by hpc.afterstep (its HOST_ACTS), in srun's environment
ENV = "HPC_HOST_ACTS"
SUBMITIT = "submitit"  # the reason of a request from submitit's own time-limit handler (requeue_on_host)
FOLDER = ".host"  # under the directory the host is given (a run's, or a sweep's): request_path
REQUEST = "request.json"  # the request's name in its attempt's folder (request_path)
END_ASK, END = "end.ask", "end.json"  # a rank's question for the job's EndTime, and the host's answer
ASKED = "asked"  # the answer's field naming the question it answers (ask_end's token)
TAKEN = END_ASK + ".taken"  # a question the host is answering (take_end_ask)
STEP_TERM = "sigterm"  # a rank's mark that its step was sent SIGTERM (mark_step_term), looked at once srun ends
# How often each side lists the folder: one listing a second per task keeps a 1000-task array to
# 1000 metadata reads a second on the shared filesystem, and the host still answers within seconds.
POLL_S = 1.0
ANSWER_WAIT_S = 60.0  # how long a rank waits for the host to carry its request out (answer)
log = logging.getLogger(__name__)


def request_path(root: str, job_id: str, restart: Any = 0) -> str:
    """The request file of one attempt of a task, in a folder of its own: <root>/.host/<job>-<restart>/,
    `root` the directory its host is given (hpc.afterstep's: a run's or a sweep's; a `--cluster here`
    run's), `job_id` its SLURM job (12, 12_3) or its `here` step (12.h1), `restart` SLURM's restart count."""
    return os.path.join(root, FOLDER, f"{job_id}-{restart}", REQUEST)


def ask(path: str, request: Mapping[str, Any]) -> None:
    """Write the request for the host (rank 0, once per stop)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(Path(path), json.dumps(dict(request)))


def pending(path: str) -> Optional[Dict[str, Any]]:
    """The request at `path` not yet settled, or None (one stat when there is none)."""
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, ValueError):  # none yet; a half-written one cannot be (atomic rename)
        return None


def done(path: str, outcome: Mapping[str, Any]) -> None:
    """Mark the request settled: its content and what the host did, beside it as .done."""
    record = {**(pending(path) or {}), "outcome": dict(outcome)}
    atomic.write_text(Path(path + ".done"), json.dumps(record))
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def answer(path: str, wait_s: Optional[float] = None, poll_s: float = POLL_S) -> Optional[Dict[str, Any]]:
    """What the host did with the request at `path` (its .done outcome), waited for up to `wait_s`
    (ANSWER_WAIT_S); None when no answer came (no wrapper reading the folder, or one too busy to)."""
    folder, name = os.path.split(path)
    until = time.monotonic() + (ANSWER_WAIT_S if wait_s is None else wait_s)
    while True:
        record = _listed_json(Path(folder), name + ".done")
        if record is not None:
            return dict(record.get("outcome") or {})
        if time.monotonic() >= until:
            return None
        time.sleep(poll_s)


def _listed_json(folder: Path, name: str) -> Optional[Dict[str, Any]]:
    """The JSON file `name` once a listing of `folder` shows it (never a stat: see above), else None.
    Written whole (atomic rename): only a vanished folder fails the read."""
    if name not in sharedfs.listed(folder):
        return None
    try:
        return dict(json.loads((folder / name).read_text()))
    except (OSError, ValueError):
        return None


def ask_end(path: str, token: str = "") -> None:
    """Ask the host for the job's EndTime (rank 0 of a `run` stage, at a stop): see end_fields.
    `token` names this question: a rank asks again when a preemption follows the time-limit warning
    (SLURM then moves EndTime to PreemptTime + GraceTime), and the earlier answer must not stand in."""
    atomic.write_text(Path(path).parent / END_ASK, token)


def end_fields(path: str, token: str = "") -> Dict[str, str]:
    """The host's answer to the ask_end named `token` (`scontrol show job`'s EndTime, JobState, ...),
    {} until it came: an answer to an earlier question is not one."""
    told = _listed_json(Path(path).parent, END) or {}
    return told if told.get(ASKED, "") == token else {}


def take_end_ask(path: str) -> Optional[str]:
    """On the host: the name (token) of a rank's ask_end, taken aside (renamed) before the host reads
    SLURM, so that a question asked meanwhile is a new file, answered at the host's next look with
    fields read after it came; None when there is none (a listing from before the last answer)."""
    folder = Path(path).parent
    try:
        os.replace(folder / END_ASK, folder / TAKEN)
        return (folder / TAKEN).read_text()
    except FileNotFoundError:
        return None


def tell_end(path: str, fields: Mapping[str, str], token: str) -> None:
    """On the host: answer the question take_end_ask took with the job's fields (read from SLURM
    by the caller after taking it), naming the question answered."""
    folder = Path(path).parent
    atomic.write_text(folder / END, json.dumps({**fields, ASKED: token}))
    with contextlib.suppress(FileNotFoundError):
        os.unlink(folder / TAKEN)


def answer_end(path: str, read: Callable[[], Mapping[str, str]]) -> None:
    """On the host: answer a rank's ask_end, where one waits, with the job's fields that `read()`
    gets from SLURM, called after the question was taken (take_end_ask), with EndTime also as a
    Unix time (a container's local time zone need not be the host's)."""
    token = take_end_ask(path)
    if token is not None:
        fields = read()
        tell_end(path, {**fields, deadline.UNIX_END: deadline.end_time(fields)}, token)


class JobNotRequeued(RuntimeError):
    """The job stopped early and will not run again; the message says why."""


def requeue_on_host() -> None:
    """In a task under hpc's srun wrapper: submitit's own time-limit handler (a stage without a
    TrainLoop; it has checkpointed and counted the timeouts) asks the host to requeue, not scontrol,
    and acts on the host's answer as a TrainLoop's stop does (hpc.recovery.preemption.handle_stop):
    requeued, submitit exits for the rerun; refused, or not carried out, the job ends with the reason
    (JobNotRequeued: its error result), not as if requeued; no answer in ANSWER_WAIT_S, it exits as
    submitit does after a requeue, and says so."""
    from submitit.slurm import slurm  # already loaded: this process is submitit's task

    def ask_host(env: Any, countdown: int) -> None:
        path = os.environ[ENV]
        ask(path, {"reason": SUBMITIT, "job_id": env.job_id, "countdown": countdown,
                   "restart": int(os.environ.get("SLURM_RESTART_COUNT") or 0)})
        outcome = answer(path)
        if outcome is None:
            log.warning("time limit: no answer from the srun wrapper on the host in %g s; exiting for the "
                        "requeue it was asked for", ANSWER_WAIT_S)
        elif "error" in outcome:
            raise JobNotRequeued(f"job stopped and not requeued: the host could not requeue it: {outcome['error']}")
        elif not outcome.get("requeue"):
            raise JobNotRequeued(f"job stopped and not requeued: {outcome.get('why')}")
        else:
            log.warning("time limit: %s (%d timeouts left); exiting for the rerun", outcome.get("why"), countdown)

    slurm.SlurmJobEnvironment._requeue = ask_host


def mark_step_term() -> None:
    """In a task under hpc's srun wrapper: the step's SIGTERM (a preemption's, at the start of GraceTime)
    leaves STEP_TERM in the attempt's folder, then goes on to the handler that was there (submitit's
    ignores it). A stage without hpc's loop works on, and a step that ends after that exits 0: SLURM
    requeues no job that ends in its GraceTime, and one ending past it is left TIMEOUT. The host
    (hpc.afterstep) sees the mark once srun has ended, and requeues it where SLURM shows it preempted."""
    mark, before = Path(os.environ[ENV]).with_name(STEP_TERM), signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        with contextlib.suppress(OSError):
            mark.touch()
        if callable(before):
            before(signum, frame)
        elif before != signal.SIG_IGN:  # the default: end as the signal would have
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
    signal.signal(signal.SIGTERM, on_term)
