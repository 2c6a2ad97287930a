"""Concurrent submissions into one run directory: count the manifest entries that get lost.

    python -c "from tests.submit_race import race; print(race(rounds=3))"   # (3, expected, 0)

Each round starts `submitters` separate processes that submit the tiny pipeline into the same new run
directory at the same instant (a barrier releases them together). Every process reports how many jobs
it submitted; the manifest must then hold exactly that many job entries. Without the run-dir lock,
two processes read the manifest, both write it, and the later write drops the other's entries (and
both run every task). Used by tests/test_submit_concurrent.py and by the reliability report.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import sys
import tempfile
from pathlib import Path
from typing import List, Optional, Tuple

PIPELINE = ["tiny", "tiny.parts=[0,1,2]"]  # 4 tasks: first, then second[0..2]


def race(rounds: int = 5, submitters: int = 3, root: Optional[Path] = None, executor: str = "debug",
         start_method: str = "fork") -> Tuple[int, int, int]:
    """(rounds, manifest entries expected, entries lost) over `rounds` rounds of `submitters`
    simultaneous submissions. `executor`: debug (tasks run inside the submitting process: cheapest)
    or local (each task its own process). Run directories stay under `root` for inspection."""
    root = Path(root or tempfile.mkdtemp(prefix="hpc-submit-race-"))
    ctx = multiprocessing.get_context(start_method)
    expected = lost = 0
    for r in range(rounds):
        run_dir = root / f"round-{r}"
        barrier, counts = ctx.Barrier(submitters), ctx.Queue()
        procs = [ctx.Process(target=_submit, args=(str(run_dir), executor, barrier, counts, sys.path))
                 for _ in range(submitters)]
        for p in procs:
            p.start()
        submitted = [counts.get(timeout=300) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        failed = [s for s in submitted if s < 0]
        if failed:
            raise RuntimeError(f"round {r}: {len(failed)} submission(s) failed; see {run_dir}")
        entries = entry_count(run_dir)
        expected += sum(submitted)
        lost += sum(submitted) - entries
    return rounds, expected, lost


def entry_count(run_dir: Path) -> int:
    """Job entries (every attempt of every task) in a run dir's manifest."""
    tasks = json.loads((Path(run_dir) / "manifest.json").read_text())["tasks"].values()
    return sum(len(t["jobs"]) for t in tasks)


def attempts(run_dir: Path) -> List[int]:
    """Job entries per task: more than one means a task was run twice."""
    tasks = json.loads((Path(run_dir) / "manifest.json").read_text())["tasks"].values()
    return [len(t["jobs"]) for t in tasks]


def _submit(run_dir: str, executor: str, barrier, counts, path: List[str]) -> None:
    """One submission (in its own process): report the number of jobs it submitted, -1 on failure."""
    sys.path[:] = path
    devnull = open(os.devnull, "w")
    sys.stdout = sys.stderr = devnull
    from hpc.pipeline import plan
    from hpc import submit
    from hpc.pipeline import submission

    plan.PIPELINES["tiny"] = "tests.tiny_pipeline"
    real, made = submission.submit_plan, []

    def counting(p, run, *args, **kwargs):  # the real submission, and how many jobs it submitted
        ids = real(p, run, *args, **kwargs)
        made.append(sum(len(v) for v in ids.values()))
        return ids

    submission.submit_plan = counting
    barrier.wait()
    code = submit.main([PIPELINE[0], "--cluster", executor, "--run-dir", run_dir, *PIPELINE[1:]])
    counts.put(sum(made) if code == 0 else -1)
    devnull.flush()
