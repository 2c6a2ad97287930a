"""What happened to a stopped job and whether it goes back in the queue: pure, from SLURM's fields.

    python -c "from hpc.recovery.verdict import classify, decide; kind, _ = classify({'JobState': 'TIMEOUT'}, 'timeout'); print(decide(kind, 'TIMEOUT', 0, 3))"

classify() reads `scontrol show job`'s fields (JobState, PreemptTime, Restarts, Reason), documented
from SLURM's observed states, and falls back to the signal seen; decide() is the requeue table.
Acting on the verdict (asking SLURM, recording, requeueing) is hpc.recovery.preemption's.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_HANGS = 3  # requeues after a hang (hpc.recovery.watchdog); a hang that comes back every time is a bug


@dataclass(frozen=True)
class Decision:
    """Outcome of a stop: requeue or not, who requeues ('hpc' runs scontrol, 'slurm' already did),
    and why, in words for the log and the error."""

    requeue: bool
    by: str | None
    why: str
    kind: str  # 'preempt' | 'timeout' | 'hang' | 'cancelled' | 'finished'


# SLURM job state -> what happened to the job. Any other state (RUNNING, COMPLETING) falls through
# to the fields below and finally to the signal seen.
STATE_KINDS = {
    "PREEMPTED": "preempt", "REQUEUED": "preempt", "REQUEUE_HOLD": "preempt",
    "REQUEUE_FED": "preempt", "PENDING": "preempt",
    "TIMEOUT": "timeout", "DEADLINE": "timeout",
    "CANCELLED": "cancelled",
    "COMPLETED": "finished", "FAILED": "finished", "NODE_FAIL": "finished", "OUT_OF_MEMORY": "finished",
}
# States in which SLURM has already queued the job again: running `scontrol requeue` is redundant.
REQUEUED_BY_SLURM = {"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "PENDING"}
_UNSET = {"", "None", "Unknown", "(null)"}


def classify(info: dict[str, str], signal_kind: str, restart_count: int = 0) -> tuple[str, bool]:
    """(what happened, whether SLURM requeues the job itself) from `scontrol show job` fields.

    During GraceTime a preempted job still reads JobState=RUNNING; SLURM marks it by setting
    PreemptTime (and EndTime = PreemptTime + GraceTime). After GraceTime it reads COMPLETING with
    Restarts already incremented. Only when SLURM shows none of these does the signal decide:
    the time-limit signal (--signal=USR2@N) leaves the job RUNNING with PreemptTime=None.
    """
    state = info.get("JobState", "UNKNOWN").split("+")[0].upper()
    if state in STATE_KINDS:
        return STATE_KINDS[state], state in REQUEUED_BY_SLURM
    if info.get("PreemptTime", "None") not in _UNSET or "preempt" in info.get("Reason", "").lower():
        return "preempt", False
    if int(info.get("Restarts", 0) or 0) > restart_count:
        return "preempt", True
    if info.get("Reason") == "TimeLimit":  # at the limit: JobState=COMPLETING, Reason=TimeLimit
        return "timeout", False
    if state == "COMPLETING":  # ending with no preemption recorded: scancel (its SIGTERM) or failure
        return "cancelled", False
    return signal_kind, False


def decide(kind: str, state: str, timeouts_done: int, max_timeouts: int,
           by: str = "hpc", hangs_done: int = 0, max_hangs: int = DEFAULT_MAX_HANGS) -> Decision:
    """Requeue table: preemption always, timeout up to `max_timeouts` times, a hang (hpc.recovery.watchdog)
    up to `max_hangs` times, never otherwise.

    `state` is what SLURM showed (for the message), `by` who requeues ('hpc' or 'slurm').
    """
    if kind == "preempt":
        return Decision(True, by, f"preempted (SLURM JobState={state})", kind)
    if kind == "hang":
        if hangs_done < max_hangs:
            return Decision(True, by, f"a rank hung: requeue {hangs_done + 1} of at most {max_hangs} "
                                      "for hangs, from the last checkpoint", kind)
        return Decision(False, None, f"hung {hangs_done + 1} times, more than max_hangs={max_hangs}. "
                        "HINT: read the stacks under the task's hangs/ directory (python -m hpc.status "
                        "names the rank and host)", kind)
    if kind == "timeout":
        if timeouts_done < max_timeouts:
            return Decision(True, by, f"time limit near: requeue {timeouts_done + 1} of at most "
                                      f"{max_timeouts} for timeouts", kind)
        return Decision(False, None, f"timed out {timeouts_done + 1} times, more than max_timeouts="
                        f"{max_timeouts}. HINT: raise max_timeouts or the time limit (--time), or "
                        "resubmit into the same run directory to continue from the checkpoint", kind)
    if kind == "cancelled":
        return Decision(False, None, f"cancelled (SLURM JobState={state}); not requeued", kind)
    return Decision(False, None, f"job is {state}; a finished job is never requeued", kind)
