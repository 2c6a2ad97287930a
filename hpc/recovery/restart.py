"""The srun wrapper's restarts in place: read what ended the step, decide (hpc.recovery.inplace), name
the next step's srun line, and record the restart in the task's history (hpc.status shows it).

    python -m hpc.afterstep RUN_DIR -- srun ...    # a failed step restarts in the same allocation

The wrapper keeps one `state` dict across the srun steps of its allocation: `number` (the step's
restart in place), `argv` (the first step's srun line), `started` (its start, Unix time), `request`
(its ranks' stop request file, hpc.recovery.hostact), `training` (the nodes it trains on; None: the
whole allocation), `costs` (measured restarts: a step's start to its first committed checkpoint),
`terminated` (SIGTERM came: SLURM is ending the job), `hang` (a hang restarted in place, decided
while srun still ran), and `next`, the next step's srun line once a restart is decided.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hpc.fs import atomic
from hpc.recovery import deadline, hangs, hostact, inplace, nodefail, requeue
from hpc.rundir import notify
from hpc.slurm import hostlist, scheduler

DEPTH = 3  # how far below the task directory checkpoints are looked for (nodefail.progress_mark's)


def first(argv: Sequence[str], environ: Mapping[str, str], state: Dict[str, Any],
          usable: Sequence[str] = ()) -> List[str]:
    """The first step's srun line: with spare nodes, on the job's nodes less the spares; `usable`: the
    nodes that passed the node check (hpc.recovery.nodecheck), where one failed and a spare replaces it."""
    spare = inplace.spare(environ)
    shape = requeue.requested(environ)
    allocation = hostlist.expand(environ.get("SLURM_JOB_NODELIST", "")) if spare else []
    if not spare or shape is None or len(allocation) <= spare:
        return list(argv)
    good = [n for n in allocation if n in usable] if usable else allocation
    # the last nodes: the first, where this wrapper runs the batch script, is a spare while it can be; a
    # training node lost for good (its slurmd gone, an OOM that takes all on it) then leaves the wrapper up
    state["training"] = good[-(len(allocation) - spare):]
    return with_args(argv, inplace.srun_args(state["training"], shape[1])[1:])


def with_args(argv: Sequence[str], args: Sequence[str]) -> List[str]:
    """srun's line with `args` as its first options (srun's options come before the command)."""
    return [argv[0], *args, *argv[1:]]


def offer(state: Dict[str, Any], task_dir: Optional[Path], history: Dict[str, Any], failed: Sequence[str],
          info: Mapping[str, str], environ: Mapping[str, str], key: str) -> Tuple[bool, str]:
    """After srun ended with an error: restart in place? (True, why) once the next step's srun line
    is in state['next'] and the restart recorded; else (False, why not). Where the stage checks its
    nodes (hpc.recovery.nodecheck), the nodes left are checked first, and one that fails is left out."""
    hang = state.pop("hang", None)  # decided while srun ran (offer_hang), recorded then
    job_state = info.get("JobState", "").split("+")[0]
    if hang is None and (state.get("terminated") or job_state != "RUNNING"):
        return False, f"SLURM is ending the job (JobState={job_state or '?'})"
    stop = hostact.pending(state["request"] + ".done")
    if hang is None and stop is not None and (stop.get("outcome") or {}).get("by") != hangs.IN_PLACE:
        return False, "its ranks stopped for a preemption or the time limit"
    allocation = hostlist.expand(environ.get("SLURM_JOB_NODELIST", ""))
    # a node that failed in an earlier step stays out, back in service or not: SLURM took it from the job
    failed = sorted(set(failed) | set(state.get("lost") or ()))
    failed = state["lost"] = sorted(set(failed) | set(checked(state, environ, [n for n in allocation
                                                                               if n not in failed])))
    nodes = state.get("training")
    if failed:
        training = state.get("training") or allocation
        fewest = (requeue.requested(environ) or ((len(training), 0), 1))[0][0]
        nodes = inplace.nodes_for(allocation, failed, len(training), fewest)
        if nodes is None:
            return False, f"{len(allocation) - len(failed)} healthy node(s) left, {fewest} needed"
    if hang is not None:
        state["training"] = nodes
        state["next"] = next_line(state, nodes, environ)
        return True, hang
    mark = nodefail.progress_mark(task_dir) if task_dir else None
    kind = "node" if failed else "error" if notify.a_rank_failed(os.path.dirname(state["request"])) else "crash"
    failure = inplace.Failure(kind, mark, mark, tuple(failed))
    return _restart(state, task_dir, history, failure, info, environ, key, nodes)


def checked(state: Dict[str, Any], environ: Mapping[str, str], nodes: Sequence[str]) -> List[str]:
    """The nodes of `nodes` that fail the stage's node check before the next step: state['check'],
    which the wrapper sets where the stage checks its nodes (hpc.recovery.nodecheck); [] without."""
    try:
        return sorted(state["check"](nodes)) if state.get("check") else []
    except Exception:  # a check that cannot run never stops a restart, as before the first step
        return []


def offer_hang(state: Dict[str, Any], task_dir: Optional[Path], history: Dict[str, Any],
               info: Mapping[str, str], environ: Mapping[str, str], key: str) -> Tuple[bool, str]:
    """A rank's hang verdict, while srun still runs: restart in place once srun has ended? The
    ranks end their step themselves (the watchdog), and offer() then starts the next one."""
    if info.get("JobState", "").split("+")[0] != "RUNNING" or task_dir is None:
        return False, f"the job is {info.get('JobState', '?')}"
    mark = nodefail.progress_mark(task_dir)
    where = hangs.attempt_dir(task_dir, environ.get("SLURM_JOB_ID", "0"), environ.get("SLURM_RESTART_COUNT") or 0,
                              {inplace.ENV: str(state["number"])})
    steps = [a.get("step") for a in hangs.HangDir(where, -1).answers().values() if a.get("step") is not None]
    failure = inplace.Failure("hang", max(steps) if steps else mark, mark)
    ok, why = _restart(state, task_dir, history, failure, info, environ, key, state.get("training"), later=True)
    if ok:
        state["hang"] = why
    return ok, why


def _restart(state: Dict[str, Any], task_dir: Optional[Path], history: Dict[str, Any], failure: inplace.Failure,
             info: Mapping[str, str], environ: Mapping[str, str], key: str, nodes: Optional[Sequence[str]],
             later: bool = False) -> Tuple[bool, str]:
    restart = int(environ.get("SLURM_RESTART_COUNT") or 0)
    before = [e for e in history.get("events", []) if e.get("kind") == inplace.KIND
              and (e.get("job"), e.get("restart")) == (key, restart)]
    end = deadline.end_time(info)
    now = time.time()
    cost = measured(state, task_dir, now)
    ok, why = inplace.decide(failure, before, inplace.limit(environ), None if end is None else end - now, cost,
                             inplace.warned(environ))
    if not ok:
        return False, why
    where = f" on {','.join(nodes)}" if nodes else ""
    failed = f" ({','.join(failure.nodes)} failed)" if failure.nodes else ""
    done = f"restarted in place as step {state['number'] + 1} of job {key}{where}{failed}"
    if task_dir is not None:
        record(task_dir, history, {"time": now, "job": key, "restart": restart, "kind": inplace.KIND,
                                   "failure": failure.kind, "step": failure.step, "progress": failure.mark,
                                   "in_place": state["number"] + 1, "failed_nodes": list(failure.nodes),
                                   "nodes": list(nodes or []), "cost_s": round(cost, 1),
                                   "left_s": None if end is None else round(end - now), "do": "restart",
                                   "why": why, "done": done})
    state["training"] = list(nodes) if nodes else None
    if not later:
        state["next"] = next_line(state, nodes, environ)
    return True, f"{why}: {done}"


def next_line(state: Mapping[str, Any], nodes: Optional[Sequence[str]], environ: Mapping[str, str]) -> List[str]:
    """The next step's srun line on `nodes`; with --overlap once a step was left on a lost node: SLURM
    counts that step's CPUs on every node as taken until it sets the node DOWN (lost())."""
    overlap = ["--overlap"] if state.get("overlap") else []
    return with_args(state["argv"], [*inplace.srun_args(nodes, _per_node(environ)), *overlap])


LOST_AFTER_S = 10.0  # srun ends a step within seconds of a rank's failure (--kill-on-bad-exit); later, it waits
LOST_ASK_S = 5.0  # how often SLURM is asked meanwhile


def lost(state: Dict[str, Any], environ: Mapping[str, str], now: Optional[float] = None) -> bool:
    """Once a rank of the step has failed, while srun still runs: whether srun waits for a node that is
    gone. A node whose slurmd died with the ranks on it is NOT_RESPONDING in SLURM soon after the step's
    end was asked of it, but DOWN, which ends the step, only SlurmdTimeout later (300 s by default).
    From LOST_AFTER_S after the failure was first seen (state['failing_since']) the step's nodes are
    looked at every LOST_ASK_S; those that failed join state['lost'], and later steps run with
    --overlap (next_line)."""
    now = time.monotonic() if now is None else now
    since = state["failing_since"] = state.get("failing_since") or now
    if now - since < LOST_AFTER_S or now - state.get("lost_asked", 0.0) < LOST_ASK_S:
        return False
    state["lost_asked"] = now
    nodes = state.get("training") or hostlist.expand(environ.get("SLURM_JOB_NODELIST", ""))
    gone = nodefail.failed_nodes(scheduler.node_states(",".join(nodes)))
    if gone:
        state.update(lost=sorted(set(state.get("lost") or ()) | set(gone)), overlap=True)
    return bool(gone)


def measured(state: Dict[str, Any], task_dir: Optional[Path], now: float) -> float:
    """What a restart takes: the longest of this allocation's steps from their start to their first
    committed checkpoint; before any, how long the failed step ran."""
    commit = committed_since(task_dir, state["started"]) if task_dir else None
    if commit is not None:
        state.setdefault("costs", []).append(commit - state["started"])
    return max(state.get("costs") or [now - state["started"]])


def committed_since(task_dir: Path, since: float) -> Optional[float]:
    """When the first checkpoint committed after `since` was (its COMPLETE.json's time), or None."""
    times = []
    for level in range(DEPTH):
        for marker in Path(task_dir).glob("/".join(["*"] * level + ["step-*", "COMPLETE.json"])):
            try:
                times.append(marker.stat().st_mtime)
            except OSError:
                continue  # removed meanwhile (keep_latest_k)
    later = [t for t in times if t >= since]
    return min(later) if later else None


def record(task_dir: Path, history: Dict[str, Any], event: Mapping[str, Any]) -> None:
    """A restart in place appended to the task's history (hpc.recovery.nodefail.HISTORY)."""
    history["restarts_in_place"] = history.get("restarts_in_place", 0) + 1
    history.setdefault("events", []).append(dict(event))
    atomic.write_text(Path(task_dir) / nodefail.HISTORY, json.dumps(history, indent=1))


def held_error(state: Mapping[str, Any]) -> str:
    """The error a failed rank of the last step held in its folder (hpc.rundir.notify.failed, its HINT
    included), or '' where none did (a rank killed, a segfault)."""
    for path in sorted(Path(os.path.dirname(state.get("request") or "")).glob("failed-*.json")):
        try:
            return str(json.loads(path.read_text()).get("text") or "")
        except (OSError, ValueError):
            continue
    return ""


def _per_node(environ: Mapping[str, str]) -> int:
    shape = requeue.requested(environ)
    return shape[1] if shape else 1
