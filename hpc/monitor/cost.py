"""Goodput of a run or a sweep from what it recorded: `python -m hpc.status RUN_DIR --cost`.

    python -m hpc.status runs/x --cost [--json]

SLURM's attempts (one `sacct -D` call, else submitit's timestamps: hpc.monitor.timeline's lanes)
give each attempt's span and the queue waits; each task's attempts.json (hpc.rundir.attempts) what
happened inside; the run's config.yaml what an attempt was allocated (stages.S.gpus_per_node, or
cpus_per_task without GPUs, per rank the attempt's start line reports). hpc.monitor.goodput splits
them; this module gathers, sums per task, stage, run and sweep, and draws the table. The status
table's GOODPUT column (hpc.monitor.goodput.share) reads only the run directory: no scheduler call
beyond the one the table makes, and an attempt's span from the process start its record holds.
"""
from __future__ import annotations

import json
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from hpc.config import resolved
from hpc.monitor import goodput, status, timeline
from hpc.rundir import attempts, sweepdir
from hpc.rundir.run import RunDir, task_key
from hpc.slurm import scheduler

HEAD = ("TASK", "ATTEMPTS", "ALLOC", "TRAINING", "REDONE", "START-UP", "CHECKPOINT", "TEARDOWN", "FAILURES",
        "GOODPUT", "QUEUE")


def resources(cfg: Mapping[str, Any], stage: str) -> Tuple[str, float, float]:
    """(unit, units per rank, ranks when no start line says): 'gpu' with GPUs per rank, else 'cpu'."""
    res = (cfg.get("stages") or {}).get(stage) or {}
    nodes = str(res.get("nodes", 1)).split("-")[0]
    per_node = max(1, int(res.get("tasks_per_node", 1) or 1))
    ranks = float(int(nodes) * per_node) if nodes.isdigit() else float(per_node)
    gpus = float(res.get("gpus_per_node", 0) or 0)
    if gpus > 0:
        return "gpu", gpus / per_node, ranks
    return "cpu", float(res.get("cpus_per_task", 1) or 1), ranks


def run_splits(run: RunDir, history: Optional[Mapping[str, List[Dict[str, str]]]],
               states: Mapping[str, str], now: float) -> List[Tuple[str, str, str, goodput.Split]]:
    """(stage, task, unit, the task's summed split) for each task of the run."""
    cfg = resolved.read(run.config_path) if run.config_path.exists() else {}
    out = []
    for t, lane in zip(run.tasks(), timeline.lanes(run, history, states, now)):
        unit, per_rank, ranks = resources(cfg, t["stage"])
        found = goodput.task(timeline.attempts_of(lane.segments, per_rank, ranks), attempts.find(run.task_dir(t["stage"], t["item"])))
        out.append((t["stage"], task_key(t["stage"], t["item"]), unit, goodput.total(found)))
    return out


def collect(path: str) -> Dict[str, Any]:
    """{'tasks': [...], 'stages': {...}, 'run': {...}} of a run; a sweep: {'points': {sig: run's}, 'sweep': ...}.
    One sacct call for every job (plus one for the states where there is no accounting)."""
    now = time.time()
    is_sweep = sweepdir.is_sweep(path)
    runs = ([sweepdir.SweepDir(path).point(sig) for sig in sweepdir.SweepDir(path).record()["points"]]
            if is_sweep else [RunDir(path)])
    history = scheduler.history([j["job_id"] for r in runs for t in r.tasks() for j in t["jobs"]
                                 if j["executor"] == "slurm"])
    local = any(j["executor"] != "slurm" for r in runs for t in r.tasks() for j in t["jobs"])
    answer = status.query_run(*runs) if history is None or local else None
    shown = {}
    for run in runs:
        states = {r.task: r.state for r in status.collect(run, answer)} if answer else {}
        shown[run.path.name] = summarize(run_splits(run, history, states, now))
    if not is_sweep:
        return next(iter(shown.values()))
    return {"points": shown, "sweep": _sum_units([p["run"] for p in shown.values()])}


def summarize(rows: List[Tuple[str, str, str, goodput.Split]]) -> Dict[str, Any]:
    """Per task, per stage and for the run: goodput.as_dict of each sum, one unit per stage."""
    tasks = [{"task": key, "stage": stage, **goodput.as_dict(sp, unit)} for stage, key, unit, sp in rows]
    stages: Dict[str, Dict[str, Any]] = {}
    for stage in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == stage]
        stages[stage] = goodput.as_dict(goodput.total(r[3] for r in mine), mine[0][2])
    return {"tasks": tasks, "stages": stages, "run": _sum_units(list(stages.values()))}


def _sum_units(parts: List[Mapping[str, Any]]) -> Dict[str, Any]:
    """Several summaries added up, GPU-hours and CPU-hours each on their own."""
    out: Dict[str, Any] = {"attempts": 0, "queue_wait_hours": 0.0}
    for part in parts:
        out["attempts"] += part["attempts"]
        out["queue_wait_hours"] = round(out["queue_wait_hours"] + part["queue_wait_hours"], 6)
        for unit in ("gpu_hours", "cpu_hours"):
            if isinstance(part.get(unit), dict):
                mine = out.setdefault(unit, dict.fromkeys((*goodput.PARTS, "allocated"), 0.0))
                for k, v in part[unit].items():
                    mine[k] = round(mine[k] + v, 6)
    for unit in ("gpu_hours", "cpu_hours"):
        if unit in out:
            spent = out[unit]["allocated"]
            out[f"{unit[:3]}_goodput"] = round(out[unit]["training"] / spent, 4) if spent > 0 else None
    return out


def _cells(name: str, part: Mapping[str, Any]) -> List[str]:
    unit = "gpu_hours" if "gpu_hours" in part else "cpu_hours"
    hours = part.get(unit) or {}
    share = part.get("goodput", part.get(f"{unit[:3]}_goodput"))
    return [name, str(part["attempts"]), f"{hours.get('allocated', 0):.3f} {unit[:3].upper()}-h",
            *(f"{hours.get(k, 0):.3f}" for k in ("training", "redone", "startup", "checkpoint", "teardown",
                                                 "failures")),
            "-" if share is None else f"{share:.0%}", f"{part['queue_wait_hours'] * 3600:.0f}s"]


def format_cost(summary: Mapping[str, Any]) -> str:
    """The --cost table: a row per task, then one per stage and the run's (a sweep: one per point)."""
    if "points" in summary:
        body = [_cells(sig, p["run"]) for sig, p in summary["points"].items()] + [_cells("sweep", summary["sweep"])]
    else:
        body = ([_cells(t["task"], t) for t in summary["tasks"]] +
                [_cells(f"stage {s}", p) for s, p in summary["stages"].items()] + [_cells("run", summary["run"])])
    widths = [max(len(x) for x in col) for col in zip(HEAD, *body)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [HEAD, *body]]
    lines.append("hours are unit-hours of the allocation (GPUs, or CPUs without GPUs); QUEUE is wall time")
    return "\n".join(lines)


def show(path: str, as_json: bool) -> int:
    """python -m hpc.status PATH --cost: print the table (or its JSON)."""
    summary = collect(path)
    print(json.dumps(summary, indent=1) if as_json else format_cost(summary))
    return 0
