"""What a task's stage function returned: the engine of hpc.Run.result(stage, item).

    python -c "import hpc; print(hpc.Run('runs/demo-20260101-120000').result('merge'))"

A stage function's return value is kept twice. submitit pickles it as the job's result (rank 0's
<job>_0_result.pkl in the task's log folder: what submitit's job.result() reads), and rank 0 copies
it into the task's done marker as JSON (hpc.pipeline.executor; JSON's types as they are, anything
else as its str()). The pickle is read: the very object the function returned. The done marker's
copy answers only for the debug executor, which runs its tasks in-process and writes no pickle. A
value the pickler refuses (a lock, an open file) leaves no pickle (submitit fails to write it after
the done marker was written): result() then raises ResultError naming the done marker, whose
copy is the value's str(). A big value is written in full in both places: return a path to big
data, not the data.
"""
from __future__ import annotations

import pickle
from typing import Any, Dict, List, Optional

from hpc.monitor import logs as tasklogs
from hpc.monitor import status as hstatus
from hpc.rundir.run import DONE, RunDir, task_key
from hpc.slurm import scheduler


class ResultError(RuntimeError):
    """A task has no result to give: not run yet, still running, failed, or unreadable here.
    `state`: the task's state then, as hpc.status names it."""

    def __init__(self, message: str, state: str):
        super().__init__(message)
        self.state = state


def result(run: RunDir, stage: str, item: Any = None) -> Any:
    """What the function of `stage` returned in the task of `item` (None: the stage's one task)."""
    task = find(run, stage, item)
    key, jid, item = task_key(stage, task["item"]), task["job_id"], task["item"]
    saved = tasklogs.select(run, stage, str(item), 0, "out")[0].parent / f"{jid}_0_result.pkl"
    if saved.is_file():
        try:
            outcome, value = pickle.loads(saved.read_bytes())  # ("success" | "error", payload): submitit's
        except Exception as err:  # a class of the user's that this process cannot import, a truncated file
            raise ResultError(f"{key}: its result {saved} does not load here ({type(err).__name__}: {err}); "
                              "expected the modules of the value's classes to be importable. HINT: import them "
                              "first, or run from the directory the pipeline's module is imported from.",
                              _state(run, key)) from None
        if outcome == "success":
            return value
        last = [ln for ln in str(value).splitlines() if ln.strip()][-1:] or ["(no traceback)"]
        raise ResultError(f"{key} failed: {last[0].strip()}; expected it to return. HINT: "
                          f"run.logs({stage!r}, {item!r}, err=True) shows the traceback.", "FAILED")
    info = hstatus.done_info(run, stage, item)
    if "result" in info and task["jobs"][-1]["executor"] == "debug":
        return info["result"]
    state = _state(run, key)
    if "result" in info and state not in scheduler.ACTIVE:
        raise ResultError(f"{key} left its done marker but no result file ({saved}): the value did not pickle "
                          "(its stderr log says why) or the file was removed; expected one that pickles. HINT: "
                          f"return plain data or a path; {run.task_dir(stage, item) / DONE} holds its JSON copy "
                          "(str() of what JSON cannot hold).", state)
    hint = ("run.wait() first" if state in scheduler.ACTIVE
            else f"run.logs({stage!r}, {item!r}, err=True), then resubmit the run")
    raise ResultError(f"{key} has no result: it is {state}; expected COMPLETED. HINT: {hint}.", state)


def _state(run: RunDir, key: str) -> str:
    """The task's state as hpc.status tells it (one scheduler call)."""
    return next((r.state for r in hstatus.collect(run) if r.task == key), "UNKNOWN")


def find(run: RunDir, stage: str, item: Any) -> Dict[str, Any]:
    """The manifest's task of (stage, item); ValueError naming the stages or items there are."""
    tasks = run.tasks()
    of_stage: List[Dict[str, Any]] = [t for t in tasks if t["stage"] == stage]
    if not of_stage:
        stages = sorted({t["stage"] for t in tasks})
        raise ValueError(f"stage {stage!r} not in {run.path}; expected one of {stages}. HINT: a stage's name, "
                         "as run.status() lists it.")
    items = [t["item"] for t in of_stage]
    chosen: Optional[Dict[str, Any]] = None
    if item is None and len(of_stage) == 1:
        chosen = of_stage[0]
    elif item is not None:
        chosen = next((t for t in of_stage if str(t["item"]) == str(item)), None)
    if chosen is None:
        which = f"{len(items)} tasks, one per item" if item is None else f"no task {item!r}"
        raise ValueError(f"stage {stage!r} has {which}; expected item= one of its items {items}. "
                         f"HINT: result({stage!r}, {items[0]!r}).")
    return chosen
