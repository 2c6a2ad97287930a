"""Node failures: was it a node or the code, and is one more attempt worth it? Pure, plus the task's
history file.

    python -c "from hpc import nodefail; print(nodefail.failed_nodes({'n1': 'IDLE', 'n2': 'DOWN+NOT_RESPONDING'}))"

hpc.afterstep asks this module after srun has ended with an error. An attempt is a node failure when
a node of its allocation is DOWN, FAIL or NOT_RESPONDING in SLURM's view by then: that is how SLURM
itself tells (it requeues a --requeue batch job whose node fails, JobState NODE_FAIL). Any other
failed end (an exception in the user's code, a rank that crashed on a healthy node) is not retried.

A node failure is requeued with the failed nodes excluded, up to `stages.X.max_node_failures` times.
Progress is the newest committed checkpoint (a step-N/ directory with its COMPLETE.json marker)
under the task directory. NO_PROGRESS_LIMIT node failures in a row, each without a checkpoint newer
than the attempt before had, stop the job: a failure that comes back before any progress is made is
rarely the node's. The rule is NVIDIA's resiliency extension's (ft_launcher stops after failing
cycles that complete no new checkpoint); as there, an attempt before the first checkpoint neither
counts nor resets it, and only max_node_failures bounds a run that never checkpoints.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from hpc.config import defaults
from hpc.fs import atomic

HISTORY = "recovery.json"  # in the task directory, beside its checkpoints
NO_PROGRESS_LIMIT = 2
# Node state words (`scontrol show node`, State=BASE+FLAG+...) that mean the node has failed.
FAILED_STATES = frozenset({"DOWN", "FAIL", "NOT_RESPONDING"})
# Job states in which SLURM has already put the job back in the queue.
QUEUED_AGAIN = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
_STEP = re.compile(r"step-([0-9]+)")


@dataclass(frozen=True)
class Action:
    """What to do after an attempt: 'requeue' (with `exclude`), 'reopen' (already requeued for
    another reason: only restore the node range), 'stop', or 'none'; `why` in words."""

    do: str
    why: str
    exclude: tuple = ()


def failed_nodes(states: Mapping[str, str]) -> List[str]:
    """The nodes whose SLURM state has a failure word in it."""
    return sorted(n for n, s in states.items() if FAILED_STATES & set(s.upper().split("+")))


def requeued(info: Mapping[str, str], restart_count: int) -> bool:
    """Whether the job is already queued again (by SLURM, or by hpc's own scontrol requeue): it is
    pending, or still COMPLETING with its Restarts counted one past this attempt's."""
    state = info.get("JobState", "").split("+")[0].upper()
    restarts = info.get("Restarts", "0")
    return state in QUEUED_AGAIN or (restarts.isdigit() and int(restarts) > restart_count)


def preempted(info: Mapping[str, str]) -> bool:
    """Whether SLURM has preempted the job (PreemptTime is set from the preemption on)."""
    return info.get("PreemptTime", "None") not in ("", "None", "Unknown", "(null)")


def progress_mark(task_dir: Path, depth: int = 3) -> Optional[int]:
    """The newest committed checkpoint step under `task_dir` (step-N/COMPLETE.json, at most `depth`
    directories down), or None before the first."""
    marks = [int(m.group(1)) for level in range(depth)
             for marker in Path(task_dir).glob("/".join(["*"] * level + ["step-*", "COMPLETE.json"]))
             for m in [_STEP.fullmatch(marker.parent.name)] if m]
    return max(marks) if marks else None


def no_progress_streak(events: Sequence[Mapping[str, Any]], mark: Optional[int]) -> int:
    """Node failures in a row, this one (with `mark`) included, none of which committed a
    checkpoint newer than the attempt before; an attempt without any checkpoint is skipped."""
    streak, before = 0, None
    for event in [*events, {"kind": "node_failure", "progress": mark}]:
        now = event.get("progress")
        if now is None:
            continue
        if before is not None and now <= before:
            streak += event.get("kind") == "node_failure"
        else:
            streak = 0
        before = now if before is None else max(before, now)
    return streak


def decide(history: Mapping[str, Any], failed: Sequence[str], already_requeued: bool, mark: Optional[int],
           limit: int, stage: str, preempted: bool = False) -> Action:
    """The table: a node failure is requeued while under `limit` and making progress; a requeue for
    any other reason only gets its node range back; a preempted job whose srun has ended without a
    requeue is requeued (its ranks died of the SIGTERM before they could requeue it, while starting,
    say: SLURM does not requeue a job that ends within GraceTime); every other end is left as it is."""
    if not failed:
        if already_requeued:
            return Action("reopen", "requeued")
        return Action("requeue", "preempted, and not requeued by the job") if preempted else \
            Action("none", "not a node failure")
    nodes, count = ",".join(failed), history.get("node_failures", 0) + 1
    if count > limit:
        return Action("stop", f"node failure {count} (on {nodes}): more than stages.{stage}.max_node_failures="
                              f"{limit}; not requeued. HINT: check the nodes (sinfo -R), raise "
                              f"stages.{stage}.max_node_failures, and resubmit with --run-dir")
    streak = no_progress_streak(history.get("events", []), mark)
    if streak >= NO_PROGRESS_LIMIT:
        return Action("stop", f"node failure {count} (on {nodes}): {streak} attempts in a row ended by a node "
                              f"failure without committing a checkpoint newer than step-{mark}; not requeued. "
                              "HINT: a failure that keeps coming back is often the job's own (memory, a "
                              "collective): read python -m hpc.logs RUN_DIR --err, then resubmit with --run-dir")
    start = f"checkpoint step-{mark}" if mark is not None else "the start (no checkpoint yet)"
    return Action("requeue", f"node failure {count} of at most {limit} (on {nodes}): requeued from {start}, "
                             f"{nodes} excluded", tuple(failed))


def load(task_dir: Path) -> Dict[str, Any]:
    try:
        return json.loads((Path(task_dir) / HISTORY).read_text())
    except (FileNotFoundError, ValueError):
        return {"node_failures": 0, "excluded": [], "events": []}


def record(task_dir: Path, history: Dict[str, Any], action: Action, job: str, restart: int,
           failed: Sequence[str], mark: Optional[int], done: str) -> None:
    """Append this attempt's end to the history; `done` says what was carried out."""
    if failed:
        history["node_failures"] = history.get("node_failures", 0) + 1
        history["excluded"] = sorted(set(history.get("excluded", [])) | set(action.exclude))
    history.setdefault("events", []).append({
        "time": time.time(), "job": job, "restart": restart, "kind": "node_failure" if failed else "requeued",
        "failed_nodes": list(failed), "progress": mark, **asdict(action), "done": done})
    atomic.write_text(Path(task_dir) / HISTORY, json.dumps(history, indent=1))


def summary(task_dir: Path) -> str:
    """One line for hpc.status: node failures, excluded nodes, and the latest decision; restarts in
    place (hpc.recovery.restart), and the latest one's reason."""
    if not (Path(task_dir) / HISTORY).exists():
        return ""
    history, parts = load(task_dir), []
    if history.get("node_failures"):
        last = next((e for e in reversed(history["events"]) if e["kind"] == "node_failure"), {})
        excluded = ", ".join(history.get("excluded", [])) or "none"
        said = f"{last.get('why')} ({last.get('done')})" if last.get("do") == "stop" else last.get("done", "")
        parts.append(f"{history['node_failures']} node failure(s), excluded: {excluded}; last: {said}")
    if history.get("restarts_in_place"):
        last = next(e for e in reversed(history["events"]) if e["kind"] == "restart_in_place")
        parts.append(f"{history['restarts_in_place']} restart(s) in place; last: {last['why']} ({last['done']})")
    return "; ".join(parts)


def env_limit(environ: Mapping[str, str] = os.environ) -> int:
    value = environ.get("HPC_MAX_NODE_FAILURES", "")
    return int(value) if value.isdigit() else defaults.MAX_NODE_FAILURES
