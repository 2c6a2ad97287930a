"""Run identity for experiment trackers: one id per run, kept in the manifest, the same in every attempt.

    python -m hpc.submit mypkg.pipeline        # every task sees HPC_RUN_ID and HPC_TASK_RUN_ID

The run id is made at the first submission into a run directory and never changes: requeues and
resubmissions into the same directory see the same one. Each task also gets a task run id, the run
id with its stage and item, since two array tasks writing into one tracker run at once would
collide. Trackers pick them up from their own variables, so that an unchanged `wandb.init()` resumes:

- wandb: WANDB_RUN_ID (the task run id), WANDB_RESUME=allow (resume the run if it exists, create
  it otherwise), WANDB_RUN_GROUP (the run id: the tasks of a run group together). Arguments given
  to wandb.init() itself still win.
- mlflow: its run ids are made by the tracking server, and `mlflow.start_run()` fails when
  MLFLOW_RUN_ID names a run that does not exist. So hpc exports MLFLOW_RUN_ID only once an earlier
  attempt of the same task started an mlflow run in the stage's process: the task records that id
  in <task>/tracking.json on its way out (a return, an exception, the SystemExit of a requeue; a
  SIGKILL records nothing, and the next attempt starts a new run).

Neither tracker is a dependency: the variables are set whether or not they are installed, and mlflow
is looked at only when the stage itself imported it.
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
import uuid
from pathlib import Path
from typing import Any, Dict, Mapping

from hpc.fs import atomic

TRACKING = "tracking.json"  # <task>/tracking.json: tracker run ids recorded by earlier attempts
MAX_ID = 64  # wandb's limit on a run id
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")  # wandb refuses / \ # ? % : in ids; keep ids plain


def new_run_id(name: str) -> str:
    """A run id that names its run directory and cannot collide with another run of that name."""
    base = _UNSAFE.sub("-", name).strip("-.")[:MAX_ID - 9] or "run"
    return f"{base}-{uuid.uuid4().hex[:8]}"


def task_run_id(run_id: str, stage: str, item: Any = None) -> str:
    """<run id>-<stage>[-<item>]: stable across attempts; too long, it keeps a digest of the rest."""
    text = _UNSAFE.sub("-", "-".join([run_id, stage] + ([] if item is None else [str(item)])))
    if len(text) <= MAX_ID:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return f"{text[:MAX_ID - 13]}-{digest}"


def environ(run_id: str, stage: str, item: Any, task_dir: Path) -> Dict[str, str]:
    """The tracker variables of one task (pure but for reading <task>/tracking.json)."""
    task = task_run_id(run_id, stage, item)
    env = {"HPC_RUN_ID": run_id, "HPC_TASK_RUN_ID": task,
           "WANDB_RUN_ID": task, "WANDB_RESUME": "allow", "WANDB_RUN_GROUP": run_id}
    mlflow_run = recorded(task_dir).get("mlflow_run_id")
    if mlflow_run:
        env["MLFLOW_RUN_ID"] = mlflow_run
    return env


def recorded(task_dir: Path) -> Dict[str, str]:
    try:
        data = json.loads((Path(task_dir) / TRACKING).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}


def record(task_dir: Path, modules: Mapping[str, Any] = sys.modules) -> None:
    """After a stage (rank 0): remember the mlflow run it used, for the next attempt. mlflow is
    asked only when the stage imported it; a run that already ended (a `with mlflow.start_run()`
    left by an exception) is still its last active run."""
    mlflow = modules.get("mlflow")
    if mlflow is None:
        return
    try:
        run = mlflow.active_run() or mlflow.last_active_run()
    except Exception:  # a tracking server that no longer answers must not fail a finished task
        return
    run_id = getattr(getattr(run, "info", None), "run_id", None)
    if run_id and recorded(task_dir).get("mlflow_run_id") != run_id:
        try:
            atomic.write_text(Path(task_dir) / TRACKING, json.dumps({**recorded(task_dir), "mlflow_run_id": run_id}))
        except OSError as err:  # never hide the stage's own outcome behind this
            print(f"[hpc] warning: mlflow run {run_id} not recorded in {task_dir}: {err}", file=sys.stderr)
