"""Restarts in place: which failure starts a new srun step in the same allocation, and on which nodes. Pure.

    python -c "from hpc.recovery import inplace; print(inplace.nodes_for(['n1', 'n2', 'n3'], ['n1'], 2, 2))"
    # ['n2', 'n3']: a spare replaces the failed node

A failure inside a healthy allocation need not go through the queue (minutes to days of waiting for
nodes the job still holds): the srun wrapper (hpc.afterstep, through hpc.recovery.restart) starts a
new srun step in the same job, whose ranks resume from the newest complete checkpoint as a requeued
job's do. Which failures (decide):
- a rank that crashed, or hit a collective timeout (srun ended with an error while the job still runs),
- the watchdog's hang verdict (hpc.recovery.watchdog: the host answers the deciding rank),
- a node lost while enough others remain (spare nodes, or a node range that can shrink: nodes_for).
A preemption or the time limit still requeues (the allocation is going away), and so does a job
SLURM itself ends (a node failure without --no-kill, scancel): the wrapper then gets SIGTERM.
Bounds, each falling back to what a requeue does today (a hang or a node failure requeued, a crash
left failed): `max_restarts_in_place` per allocation; never when the time the allocation has left
is below the time a restart took (measured: a step's start to its first committed checkpoint); the
same failure at the same step as the last restart, or no checkpoint newer than at the last restart
(a failure that comes back before any progress is rarely transient: NVIDIA's resiliency extension
stops on the same rule).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from hpc.config import defaults

ENV = "HPC_RESTART_IN_PLACE"  # the step's number in its allocation (0: the first), in srun's environment
LIMIT_ENV = "HPC_MAX_RESTARTS_IN_PLACE"  # stages.X.max_restarts_in_place, exported by the batch script
SIGNAL_ENV = "HPC_SIGNAL_DELAY_S"  # stages.X.signal_delay_s, exported by the batch script
SIGNAL_LOOK_S = 30.0  # SLURM sends --signal at its first look at the job within the delay: it looks every 30 s
SPARE_ENV = "HPC_SPARE_NODES"  # stages.X.spare_nodes, exported by the batch script
KIND = "restart_in_place"  # the kind of a restart's event in the task's history (hpc.recovery.nodefail)
FAILURES = {"crash": "a rank crashed or hit a collective timeout", "hang": "a rank hung",
            "node": "a node failed", "error": "a rank exited with an error"}


@dataclass(frozen=True)
class Failure:
    """What ended a step: `kind` (a key of FAILURES), the `step` it reached (a hang's, else the
    newest checkpoint's), the newest committed checkpoint (`mark`), and the failed nodes."""

    kind: str
    step: Optional[int]
    mark: Optional[int]
    nodes: Tuple[str, ...] = ()


def number(environ: Mapping[str, str]) -> int:
    """This step's restart in place (0: the allocation's first step)."""
    text = environ.get(ENV, "")
    return int(text) if text.isdigit() else 0


def tag(environ: Mapping[str, str]) -> str:
    """What tells a restarted step's attempt from the step before it in names keyed by job and
    restart count (hang folders, the checkpoint writer's generation): '' for the first, '.K' after."""
    return f".{number(environ)}" if number(environ) else ""


def limit(environ: Mapping[str, str]) -> int:
    text = environ.get(LIMIT_ENV, "")
    return int(text) if text.isdigit() else defaults.MAX_RESTARTS_IN_PLACE


def warned(environ: Mapping[str, str]) -> float:
    """The stage's signal_delay_s (SIGNAL_ENV, exported by the batch script); 0 when not told."""
    text = environ.get(SIGNAL_ENV, "")
    return float(text) if text.isdigit() else 0.0


def spare(environ: Mapping[str, str]) -> int:
    text = environ.get(SPARE_ENV, "")
    return int(text) if text.isdigit() else 0


def decide(failure: Failure, before: Sequence[Mapping[str, Any]], most: int, left_s: Optional[float],
           cost_s: float, warned_s: float = 0.0) -> Tuple[bool, str]:
    """(restart in place?, why) for `failure`, given this allocation's earlier restarts in place
    (their history events, oldest first), `most` of them allowed, `left_s` seconds left in the
    allocation (None: unknown), `cost_s`, what a restart takes, and `warned_s`, the stage's
    signal_delay_s: within it the time limit's signal has come, and a rank that failed then (submitit's
    handler over max_timeouts, say) ended with the allocation."""
    if len(before) >= most:
        return False, f"restarted in place {len(before)} time(s) already (max_restarts_in_place={most})"
    if left_s is not None and warned_s and left_s <= warned_s + SIGNAL_LOOK_S:
        return False, (f"{left_s:.0f} s left in the allocation: its time-limit signal (due {warned_s:.0f} s before "
                       f"the end, at SLURM's look up to {SIGNAL_LOOK_S:.0f} s earlier) has come")
    if left_s is not None and left_s <= cost_s:
        return False, f"{left_s:.0f} s left in the allocation, and a restart took {cost_s:.0f} s"
    where = f"checkpoint step-{failure.mark}" if failure.mark is not None else "the start (no checkpoint yet)"
    if before:
        last = before[-1]
        if (last.get("failure"), last.get("step")) == (failure.kind, failure.step):
            at = f"at step {failure.step}" if failure.step is not None else "before any checkpoint"
            return False, f"{FAILURES[failure.kind]} {at} again, as before the last restart in place"
        if last.get("progress") == failure.mark:
            return False, f"no checkpoint newer than {where} since the last restart in place"
    return True, f"{FAILURES[failure.kind]}: restart in place {len(before) + 1} of at most {most}, from {where}"


def nodes_for(allocation: Sequence[str], avoid: Sequence[str], training: int, fewest: int) -> Optional[List[str]]:
    """The nodes the next step trains on: `training` of the allocation's nodes not in `avoid` (a
    spare replaces a failed node), else all of them if at least `fewest` (a node range shrinks, as
    an elastic resume); None when too few are left (a requeue without the bad nodes)."""
    healthy = [n for n in allocation if n not in set(avoid)]
    if len(healthy) >= training:
        return healthy[:training]
    return healthy if len(healthy) >= fewest else None


def srun_args(nodes: Optional[Sequence[str]], tasks_per_node: int) -> List[str]:
    """srun's options for a step on `nodes` (None: the whole allocation, as the first step ran).
    A restarted step appends to the ranks' logs instead of truncating the first step's."""
    where = [f"--nodes={len(nodes)}", f"--ntasks={len(nodes) * tasks_per_node}",
             f"--nodelist={','.join(nodes)}"] if nodes else []
    return ["--open-mode=append", *where]
