"""What the node checks of a run found, and the run's avoid list read from it.

    python -c "from hpc.recovery import nodecheckrecord as r; print(r.avoided('runs/my-run'))"

One small file per check, <run_dir>/nodecheck/<job>-<restart>-<k>[.failed].json (k: the check's
number within that attempt, for restarts in place; .failed where a node failed), written once by the
batch script's wrapper from what every node answered: never a file per node or per rank. It names
each failed node with its reasons. The avoid list is no file of its own: it is counted from the
.failed records (a node in `avoid_after` of them or more), so no two jobs of a run ever write one
file, and a run of many passing checks (a sweep's thousand tasks) costs each check one listing.
"""
from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

from hpc.fs import atomic

FOLDER = "nodecheck"
FAILED = ".failed"  # ends the name of a record in which a node failed: the avoid list reads only those
AVOIDED = "avoided:"  # starts the reason given for a node on the avoid list, which is not checked again


def folder(run_dir: Any) -> Path:
    return Path(run_dir) / FOLDER


def records(run_dir: Any, failed_only: bool = False) -> List[Dict[str, Any]]:
    """Every check of the run (`failed_only`: those a node failed), oldest first; a record that cannot
    be read is skipped."""
    found = []
    for path in sorted(folder(run_dir).glob(f"*{FAILED}.json" if failed_only else "*.json")):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(found, key=lambda r: r.get("time", 0))


def failures(history: Sequence[Mapping[str, Any]]) -> Counter:
    """How many checks each node failed (an avoided node, not checked again, is not counted again)."""
    return Counter(node for r in history for node, why in (r.get("failed") or {}).items()
                   if not str(why).startswith(AVOIDED))


def avoided(run_dir: Any, after: int = 2) -> List[str]:
    """The run's avoid list: the nodes that failed `after` checks or more."""
    return sorted(n for n, count in failures(records(run_dir, True)).items() if count >= max(1, after))


def write(run_dir: Any, job: str, restart: str, nodes: Sequence[str], failed: Mapping[str, str],
          answers: Mapping[str, Mapping[str, Any]], note: str = "") -> Path:
    """This check's record; returns its path."""
    where = folder(run_dir)
    where.mkdir(parents=True, exist_ok=True)
    k = len(list(where.glob(f"{job}-{restart}-*.json")))
    path = where / f"{job}-{restart}-{k}{FAILED * bool(failed)}.json"
    costs = {n: [a.get("wall_s"), a.get("cpu_s")] for n, a in answers.items()}
    record = {"time": time.time(), "job": job, "restart": restart, "nodes": list(nodes), "failed": dict(failed),
              "note": note, "wall_cpu_s": costs}
    atomic.write_text(path, json.dumps(record, indent=1))
    return path


def done(path: Path, what: str) -> None:
    """Add what the wrapper did after the check (requeued without the failed nodes, stopped)."""
    record = json.loads(path.read_text())
    record["done"] = what
    atomic.write_text(path, json.dumps(record, indent=1))


def requeues(run_dir: Any, job: str) -> int:
    """How many times job `job` was requeued for a failed check (bounds a check that always fails)."""
    return sum(1 for r in records(run_dir, True) if r.get("job") == job and str(r.get("done", "")).startswith("requeue"))
