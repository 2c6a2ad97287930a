"""What each allocated GPU-hour bought: an attempt's time split into start-up, training that counts,
training redone after a resume, checkpoint stall, stop and teardown, and time lost to failures. Pure.

    python -c "from hpc.monitor import goodput; print(goodput.split(goodput.Attempt('1', 0, 0, 100, 'COMPLETED'), None, None))"

An attempt is SLURM's (sacct's Start and End, or submitit's timestamps without accounting: its
bar in hpc.monitor.timeline); what happened inside it is rank 0's record (hpc.rundir.attempts): when
the first step began (F), each checkpoint's step, time and the loop's stall, when the loop stopped or
ended (T). Which steps were kept is known only afterwards: the next attempt says which step it resumed
from, and that checkpoint's time is the kept mark K. On the attempt's span S..E, S <= F <= K <= T <= E:

    start-up    S..F      job start to the first step (imports, the process group, loading a checkpoint)
    training    F..K      less the checkpoint stalls in it: steps that count
    redone      K..T      less the stalls in it: steps a later attempt ran again (or, on the last
                          attempt that failed, steps lost); on an attempt whose record has no end (a
                          hang's verdict or a kill ended it), K..E, the hang's wait included
    checkpoint  the time checkpoint saves held the loop (rank 0's measure)
    teardown    T..E      the stop and exit after the loop ended: a stop's checkpoint, the requeue
    failures    on an attempt that failed (an error, a node failure, a refused resume): K..E in place
                of redone and teardown

The six add up to E - S exactly. An attempt without a record (a stage without hpc's training loop, a
rank that never reached it) is counted whole by how it ended: completed or running as training,
preempted or requeued as redone, anything else as failures. A `run` script's record is the wrapper's
(hpc.scripts.runner): F is the script's start, the checkpoints are the committed step-N/ folders
seen at its end. GPU-hours are seconds x the attempt's GPUs / 3600 (CPU-hours on a stage without
GPUs). Queue wait (queued, requeued) is wall time beside the allocation, not part of it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional

PARTS = ("startup", "training", "redone", "checkpoint", "teardown", "failures")
FAILED = frozenset({"FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "ENDED", "CANCELLED", "BOOT_FAIL", "DEADLINE"})
KEPT_WHOLE = {"COMPLETED": "training", "RUNNING": "training", "PREEMPTED": "redone", "REQUEUED": "redone",
              "TIMEOUT": "redone"}


@dataclass(frozen=True)
class Attempt:
    job: str
    restart: int
    start: float  # epoch seconds
    end: float
    state: str  # how it ended, in hpc's words (hpc.monitor.timeline's kinds)
    units: float = 1.0  # GPUs (or CPUs) allocated to it
    queued_s: float = 0.0  # wall time it waited in the queue before it started


@dataclass
class Split:
    """Seconds of each part; `units` x seconds are the unit-seconds allocated."""

    units: float = 1.0
    seconds: Dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    queued_s: float = 0.0
    attempts: int = 0
    spans: List[tuple] = field(default_factory=list)  # (start, end, part) of the time not spent training

    @property
    def allocated_s(self) -> float:
        return sum(self.seconds.values())

    def hours(self) -> Dict[str, float]:
        """Unit-hours of each part, and of the whole ('allocated')."""
        out = {k: v * self.units / 3600 for k, v in self.seconds.items()}
        out["allocated"] = self.allocated_s * self.units / 3600
        return out

    def goodput(self) -> Optional[float]:
        """The share of the allocation that trained and counts (None before any allocation)."""
        return self.seconds["training"] / self.allocated_s if self.allocated_s > 0 else None


def _clamp(x: Optional[float], low: float, high: float) -> float:
    return low if x is None else min(max(float(x), low), high)


def _kept_mark(rec: Mapping[str, Any], nxt: Optional[Mapping[str, Any]], f: float, t: float,
               running: bool) -> tuple:
    """(K, the stall before K, the step K kept or None): the time of the checkpoint the run
    continued from."""
    saves = [s for s in rec.get("saves") or [] if isinstance(s, list) and len(s) == 3]
    total = float(rec.get("stall_s") or 0.0)
    if rec.get("end") == "completed" or (running and nxt is None):
        return t, total, None
    if nxt is not None and isinstance(nxt.get("resumed"), int):
        step, first = nxt["resumed"], int(rec.get("resumed") or 0)
        hit = next((s for s in saves if s[0] == step), None)
        if hit:
            return hit[1], hit[2], step
        if step <= first or not saves:
            return f, 0.0, None
        last = int(rec.get("step") or saves[-1][0])  # a save older than those kept: in proportion
        share = min(1.0, (step - first) / max(1, last - first))
        return f + (t - f) * share, total * share, None
    # a resubmission continues from the newest
    return (saves[-1][1], saves[-1][2], saves[-1][0]) if saves else (f, 0.0, None)


def split(attempt: Attempt, rec: Optional[Mapping[str, Any]], nxt: Optional[Mapping[str, Any]]) -> Split:
    """The parts of one attempt; `rec`: its record, `nxt`: the next attempt's (None: none yet)."""
    s, e = attempt.start, max(attempt.end, attempt.start)
    out = Split(units=attempt.units, queued_s=attempt.queued_s, attempts=1)
    if not rec:
        part = KEPT_WHOLE.get(attempt.state, "failures")
        out.seconds[part] = e - s
        out.spans = [(s, e, part)] if part != "training" and e > s else []
        return out
    began = rec.get("first_step", rec.get("began"))
    f = _clamp(began, s, e)
    failed = rec.get("end") in ("failed", "refused") or attempt.state in FAILED
    last_known = rec.get("ended") or (max((x[1] for x in rec.get("saves") or []), default=None) if failed else None)
    t = _clamp(last_known if last_known is not None else e, f, e)
    k, stall_k, kept = _kept_mark(rec, nxt, f, t, attempt.state == "RUNNING")
    k = _clamp(k, f, t)
    before = _clamp(stall_k, 0.0, k - f)
    after = _clamp(float(rec.get("stall_s") or 0.0) - float(stall_k or 0.0), 0.0, t - k)
    out.seconds.update(startup=f - s, training=k - f - before, checkpoint=before + after)
    # a stop saves the step it stopped at: after that checkpoint, no step ran and nothing was redone. An
    # attempt whose end is not recorded (a hang's verdict, a kill) ran steps past its last save unrecorded
    stopped_there = rec.get("end") == "stopped" and kept is not None and rec.get("step") == kept
    after_k = "failures" if failed else "teardown" if stopped_there else "redone"
    out.seconds[after_k] += t - k - after
    out.seconds["failures" if failed else "teardown"] += e - t
    out.spans = [(a, b, part) for a, b, part in ((s, f, "startup"), (k, t, after_k),
                                                  (t, e, "failures" if failed else "teardown")) if b > a]
    return out


def task(attempts: Iterable[Attempt], records: List[Mapping[str, Any]]) -> List[Split]:
    """Each attempt of one task, oldest first, split with its record matched by (job, restart)."""
    by_id = {(str(r.get("job")), int(r.get("restart") or 0)): r for r in records}
    ordered = sorted(attempts, key=lambda a: a.start)
    recs = [by_id.get((a.job, a.restart)) for a in ordered]
    return [split(a, recs[n], next((r for r in recs[n + 1:] if r), None)) for n, a in enumerate(ordered)]


# how a record says its attempt ended -> the state goodput counts it as
ENDS = {"completed": "COMPLETED", "stopped": "REQUEUED", "failed": "FAILED", "refused": "FAILED"}


def from_records(records: List[Mapping[str, Any]], state: str, now: float) -> List[Attempt]:
    """Attempts as the records alone tell them (hpc.status's column: no sacct): from the process's
    start to the record's end, or its last save; the last one, without an end, in `state` (until now
    while it runs)."""
    out = []
    for n, rec in enumerate(records):
        last, saves = n == len(records) - 1, rec.get("saves") or []
        start = rec.get("process_start") or rec.get("began")
        if not isinstance(start, (int, float)):
            continue
        end = rec.get("ended") or (now if last and state == "RUNNING" else
                                   max([s[1] for s in saves] + [rec.get("first_step") or start]))
        how = ENDS.get(rec.get("end"), state if last else "REQUEUED")
        out.append(Attempt(str(rec.get("job")), int(rec.get("restart") or 0), float(start), float(end), how))
    return out


def share(records: List[Mapping[str, Any]], state: str, now: float) -> Optional[float]:
    """The goodput of a task from its records alone (None without any)."""
    return total(task(from_records(records, state, now), records)).goodput()


def total(splits: Iterable[Split]) -> Split:
    """The sum of several splits; `units` becomes 1: its seconds are unit-seconds."""
    out = Split(units=1.0)
    for sp in splits:
        for k, v in sp.seconds.items():
            out.seconds[k] += v * sp.units
        out.queued_s += sp.queued_s
        out.attempts += sp.attempts
    return out


def as_dict(sp: Split, unit: str = "gpu") -> Dict[str, Any]:
    """{unit}_hours per part and allocated, goodput share, queue wait in wall hours, attempts."""
    share = sp.goodput()
    return {f"{unit}_hours": {k: round(v, 6) for k, v in sp.hours().items()},
            "goodput": None if share is None else round(share, 4),
            "queue_wait_hours": round(sp.queued_s / 3600, 6), "attempts": sp.attempts}
