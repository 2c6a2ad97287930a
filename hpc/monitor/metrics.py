"""What a run's tasks measured: each task's metrics.json, with its goodput on request (hpc.Run.metrics).

    python -c "import hpc; print(hpc.Run.attach('runs/x').metrics(goodput=True))"

A task's metrics.json is whatever its stage function wrote there; `goodput` adds the figures
python -m hpc.status --cost shows of it (hpc.monitor.cost). A sweep's are gathered with one
scheduler call for every point (cost.collect of the sweep), not one per point.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterable, Mapping

from hpc.fs.sharedfs import listed
from hpc.rundir.run import RunDir, task_key


def of_run(path: Path, goodput: bool = False) -> Dict[str, Any]:
    """Task ('stage[item]') -> its metrics.json (for the tasks that wrote one), and 'goodput' with `goodput`."""
    rows = _cost(path)["tasks"] if goodput else []
    return merged(path, rows)


def of_sweep(path: Path, points: Mapping[str, Path], goodput: bool = False) -> Dict[str, Dict[str, Any]]:
    """Point signature -> of_run of that point; the goodput of every point from one scheduler call."""
    shown = _cost(path)["points"] if goodput else {}
    return {sig: merged(where, (shown.get(Path(where).name) or {}).get("tasks", [])) for sig, where in points.items()}


def _cost(path: Path) -> Dict[str, Any]:
    from hpc.monitor import cost  # only with goodput: it reads the config and asks sacct

    return cost.collect(str(path))


def merged(path: Path, goodput_rows: Iterable[Mapping[str, Any]]) -> Dict[str, Any]:
    """Each task's metrics.json with its row of hpc.monitor.cost (GPU- or CPU-hours per part, the
    share that trained, queue wait) as 'goodput'."""
    found: Dict[str, Any] = {row["task"]: {"goodput": {k: v for k, v in row.items() if k not in ("task", "stage")}}
                             for row in goodput_rows}
    run = RunDir(path)
    for t in run.tasks():
        where = run.task_dir(t["stage"], t["item"])
        if "metrics.json" in listed(where):
            try:
                key = task_key(t["stage"], t["item"])
                found[key] = {**json.loads((where / "metrics.json").read_text()), **found.get(key, {})}
            except ValueError:
                continue  # being rewritten: absent this time
    return found
