"""A picture of a run: each task's life over time, one bar per attempt (drawn by hpc.monitor.timeline_plot).

    python -m hpc.status runs/langsplat-20260101-120000 --timeline run.svg     # or .png

Where the times come from. With accounting, one `sacct -D` call (hpc.slurm.scheduler.history) gives every
start of every job the run ever submitted, requeues included: Submit, Eligible (its stage dependency
met), Start, End and State per attempt. Without it (squeue only, or the local executor), the
manifest's submission times and, per attempt, the timestamps submitit writes into the rank-0 log; an
attempt that was requeued is then drawn up to the next one's start. The world size of each attempt is
what its rank-0 log's start line says (`restart R` numbers the attempts), else the done marker's.

Each lane is a task: waiting on its stage dependency (the gap a dependency causes), queued, then a bar
per attempt in the colour of how it ended, with a requeued wait between attempts, and a mark on the
bar where the attempt restarted in place (the task's recovery history: one sacct attempt, new steps).
A sweep (hpc.rundir.sweepdir) has one row per point, its tasks as lanes within the row.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hpc.monitor import goodput, status
from hpc.recovery import inplace, nodefail
from hpc.rundir import attempts, sweepdir
from hpc.rundir.run import RunDir, task_key
from hpc.slurm import scheduler

# kind -> (legend text, colour): waits first, then how an attempt ended (hpc states)
KINDS: Dict[str, tuple] = {
    "dependency": ("waiting on a stage dependency", "#eeeeee"),
    "queued": ("queued", "#c7c7c7"),
    "requeued": ("requeued, waiting", "#e8d7a8"),
    "RUNNING": ("running", "#4c9be8"),
    "COMPLETED": ("completed", "#2ca02c"),
    "PREEMPTED": ("stopped for a preemption", "#ff7f0e"),
    "REQUEUED": ("stopped and requeued", "#e5c100"),
    "TIMEOUT": ("timed out", "#9467bd"),
    "FAILED": ("failed", "#d62728"),
    "CANCELLED": ("cancelled", "#7f7f7f"),
    "ENDED": ("ended, outcome unknown", "#bcbd22"),
    # drawn as a strip along the bottom of an attempt's bar: where its allocation bought no kept training
    "startup": ("start-up (job start to first step)", "#17becf"),
    "redone": ("training redone after a resume", "#ff9896"),
    "teardown": ("stop and teardown", "#c5b0d5"),
    "failures": ("lost to a failure", "#8c564b"),
    "RESTARTED": ("restarted in place (a new srun step, same allocation)", "#e377c2"),  # a mark on the bar
}
LOST = ("startup", "redone", "teardown", "failures")  # hpc.monitor.goodput's parts, as strips
NEW_SOFTWARE = "new software"  # on the bar of an attempt that ran on other software than the one before
REQUEUE_WORDS = frozenset({"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})  # an attempt SLURM put back in the queue
# A job that requeues itself (hpc.recovery.preemption) reads REQUEUED in sacct; why it stopped is in the record
# hpc.recovery.preemption keeps in the task's checkpoint directory: stop kind -> what the picture shows.
STOPS = Path("checkpoints") / "requeue.json"
STOP_KINDS = {"preempt": "PREEMPTED", "timeout": "TIMEOUT"}
# hpc.pipeline.executor's start line in the rank-0 log, one per attempt
STARTED = re.compile(rb"\[hpc\] stage .* rank 0/([0-9]+) on [0-9]+ node\(s\) job \S+ restart ([0-9]+)")
STOP_SLACK_S = 5.0  # a stop is recorded just before its attempt ends; sacct's End may come a little later
SUBMITIT = re.compile(rb"submitit \w+ \((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\) - (.*)")


@dataclass(frozen=True)
class Segment:
    start: float  # epoch seconds
    end: float
    kind: str  # a key of KINDS
    label: str = ""  # the world size, on an attempt's bar
    gid: str = ""  # an attempt's id in the picture: attempt-<task>-<job id>-<n>


@dataclass
class Lane:
    name: str  # the task, e.g. second[1]
    segments: List[Segment]


@dataclass
class Row:
    label: str
    lanes: List[Lane]


def _epoch(text: str) -> Optional[float]:
    """sacct's and the manifest's times (local time, the manifest's with its offset); None if unknown."""
    for fmt in ("%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"):
        try:
            return datetime.strptime(text, fmt).timestamp()
        except (TypeError, ValueError):
            continue
    return None


def _ranks(n: int) -> str:
    return f"{n} rank{'s' * (n != 1)}"


def worlds(log: Path) -> Dict[int, int]:
    """restart number -> world size, from the start lines of a rank-0 log."""
    if not log.exists():
        return {}
    return {int(m[2]): int(m[1]) for m in STARTED.finditer(log.read_bytes())}


def stops(task_dir: Path) -> List[Tuple[float, str]]:
    """(time, kind in KINDS) of each stop hpc.recovery.preemption recorded for the task, oldest first."""
    try:
        events = json.loads((task_dir / STOPS).read_text()).get("events", [])
    except (OSError, ValueError, AttributeError):
        return []
    return sorted((float(e["time"]), STOP_KINDS[e.get("kind")]) for e in events
                  if isinstance(e, dict) and e.get("kind") in STOP_KINDS and isinstance(e.get("time"), (int, float)))


def _why(kind: str, start: float, end: float, stopped: Sequence[Tuple[float, str]]) -> str:
    """A REQUEUED attempt's reason, from the stop recorded while it ran; other kinds unchanged."""
    if kind != "REQUEUED":
        return kind
    return next((why for t, why in stopped if start <= t <= end + STOP_SLACK_S), kind)


def from_history(records: Sequence[Mapping[str, str]], submitted: float, waits: bool, sizes: Dict[int, int],
                 gid: str, now: float, stopped: Sequence[Tuple[float, str]] = ()) -> List[Segment]:
    """One job's segments from its sacct records (one per start). `waits`: it has a dependency;
    `stopped`: stops() of its task."""
    segs: List[Segment] = []
    if not records:  # just submitted: sacct lists it once slurmdbd has it
        return [Segment(submitted, now, "dependency" if waits else "queued")]
    begin: Optional[float] = None
    for n, rec in enumerate(sorted(records, key=lambda r: _epoch(r["Start"]) or now)):
        submit, eligible = _epoch(rec["Submit"]) or submitted, _epoch(rec["Eligible"])
        start, end = _epoch(rec["Start"]), _epoch(rec["End"])
        if begin is None:  # the first attempt: a dependency (until SLURM found it eligible), then the queue
            begin = min(submit, submitted)
            if waits:
                ready = min(eligible or now, start or now)
                segs.append(Segment(begin, ready, "dependency"))
                begin = ready
        segs.append(Segment(begin, start or now, "queued" if n == 0 else "requeued"))
        if start is None:
            break
        word = (rec["State"].split() or [""])[0].split("+")[0]
        kind = "REQUEUED" if word in REQUEUE_WORDS else scheduler.hpc_state(rec["State"], rec["Reason"])
        kind = _why(kind, start, end or now, stopped)
        segs.append(Segment(start, end or now, kind if kind in KINDS else "ENDED",
                            _ranks(sizes[n]) if n in sizes else "", f"{gid}-{n + 1}"))
        begin = end or now
    return [s for s in segs if s.end > s.start or s.gid]


def from_log(log: Path, submitted: float, waits: bool, last: str, finished: Optional[float],
             sizes: Dict[int, int], gid: str, now: float, stopped: Sequence[Tuple[float, str]] = ()) -> List[Segment]:
    """One job's segments without accounting: its attempts from submitit's timestamps in the rank-0
    log. `last`: the hpc state of its last attempt; `finished`: the done marker's time."""
    found = SUBMITIT.finditer(log.read_bytes()) if log.exists() else ()
    lines = [((_epoch(m[1].decode()) or 0.0) + int(m[2]) / 1000, m[3]) for m in found]
    starts = [t for t, msg in lines if msg.startswith(b"Starting with JobEnvironment")]
    wait = "dependency" if waits else "queued"
    if not starts:
        return [Segment(submitted, now if last in scheduler.ACTIVE else submitted, wait)]
    segs = [Segment(submitted, starts[0], wait)]
    for n, start in enumerate(starts):
        final = n == len(starts) - 1
        end = starts[n + 1] if not final else (finished or (now if last in scheduler.ACTIVE
                                                            else max(t for t, _ in lines)))
        kind = last if final else _why("REQUEUED", start, end, stopped)
        segs.append(Segment(start, max(end, start), kind if kind in KINDS else "ENDED",
                            _ranks(sizes[n]) if n in sizes else "", f"{gid}-{n + 1}"))
    return segs


def lanes(run: RunDir, history: Optional[Mapping[str, List[Dict[str, str]]]], states: Mapping[str, str],
          now: float) -> List[Lane]:
    """One lane per task of the run, every job it ever had (resubmissions too) along it."""
    out = []
    for t in run.tasks():
        key, segs = task_key(t["stage"], t["item"]), []
        for job in t["jobs"]:
            jid, submitted = job["job_id"], _epoch(job["submitted"]) or now
            sizes, stopped = worlds(run.log_path(t["stage"], jid)), stops(run.task_dir(t["stage"], t["item"]))
            waits, gid = bool(job.get("after")), f"attempt-{key}-{jid}"
            if history is not None and job["executor"] == "slurm":
                segs += from_history(history.get(jid, []), submitted, waits, sizes, gid, now, stopped)
                continue
            latest = jid == t["job_id"]
            last = states.get(key, "ENDED") if latest else status.left_behind(run, t["stage"], t["item"], jid)
            done = status.done_info(run, t["stage"], t["item"]) if latest else {}
            segs += from_log(run.log_path(t["stage"], jid), submitted, waits, last, done.get("finished"),
                             sizes, gid, now, stopped)
        found = attempts.find(run.task_dir(t["stage"], t["item"]))
        marks = in_place(run.task_dir(t["stage"], t["item"]), segs)
        out.append(Lane(key, (segs + lost(segs, found) if found else segs) + marks))
    return out


def in_place(task_dir: Path, segs: Sequence[Segment]) -> List[Segment]:
    """A mark on its attempt's bar at each restart in place the task's history records
    (hpc.recovery.restart: a new srun step in the same allocation, which sacct shows as one attempt)."""
    try:
        events = json.loads((task_dir / nodefail.HISTORY).read_text()).get("events", [])
    except (OSError, ValueError, AttributeError):
        return []
    times = [float(e["time"]) for e in events if isinstance(e, dict) and e.get("kind") == inplace.KIND
             and isinstance(e.get("time"), (int, float))]
    span = max((s.end for s in segs), default=0.0) - min((s.start for s in segs), default=0.0)
    return [Segment(t, t + max(1.0, span * 0.005), "RESTARTED") for t in times]


def attempts_of(segs: Sequence[Segment], per_rank: float = 1.0, ranks: float = 1.0) -> List[goodput.Attempt]:
    """A lane's attempts for hpc.monitor.goodput: (job, restart) from each bar's id, its GPUs (or CPUs)
    from the world size on it (`ranks` where none is) x `per_rank`, the queue wait before it."""
    out, waited = [], 0.0
    for seg in segs:
        if not seg.gid:
            waited += (seg.end - seg.start) if seg.kind in ("queued", "requeued") else 0.0
            continue
        _, job, n = seg.gid.rsplit("-", 2)
        size = float(seg.label.split()[0]) if seg.label[:1].isdigit() else ranks
        out.append(goodput.Attempt(job, int(n) - 1, seg.start, seg.end, seg.kind, size * per_rank, waited))
        waited = 0.0
    return out


def lost(segs: List[Segment], records: List[Dict[str, Any]]) -> List[Segment]:
    """The strips of time an attempt bought no kept training (LOST), from rank 0's records; an attempt
    that ran on other software than the one before gets NEW_SOFTWARE on its bar."""
    digests = {(str(r.get("job")), int(r.get("restart") or 0)): r.get("software_digest") for r in records}
    before = None
    for n, seg in enumerate(segs):
        if seg.gid:
            _, job, k = seg.gid.rsplit("-", 2)
            now = digests.get((job, int(k) - 1))
            if before and now and now != before:
                segs[n] = replace(seg, label=f"{seg.label} · {NEW_SOFTWARE}".lstrip(" ·"))
            before = now or before
    return [Segment(a, b, part) for sp in goodput.task(attempts_of(segs), records) for a, b, part in sp.spans]


def collect(path: str) -> List[Row]:
    """The rows of a run (one per task) or of a sweep (one per point), from one scheduler call
    (plus one more for the states where there is no accounting)."""
    now = time.time()
    is_sweep = sweepdir.is_sweep(path)
    record = sweepdir.SweepDir(path).record()["points"] if is_sweep else {}
    runs = [sweepdir.SweepDir(path).point(sig) for sig in record] if is_sweep else [RunDir(path)]
    jobs = [j["job_id"] for run in runs for t in run.tasks() for j in t["jobs"] if j["executor"] == "slurm"]
    history = scheduler.history(jobs)
    local = any(j["executor"] != "slurm" for run in runs for t in run.tasks() for j in t["jobs"])
    answer = status.query_run(*runs) if history is None or local else None  # the states from_log needs
    rows = []
    for run in runs:
        states = {r.task: r.state for r in status.collect(run, answer)} if answer else {}
        found = lanes(run, history, states, now)
        if is_sweep:
            sig = run.path.name
            rows.append(Row(f"{sig} {sweepdir.describe(record[sig]['overrides'])}", found))
        else:
            rows += [Row(lane.name, [lane]) for lane in found]
    return rows
