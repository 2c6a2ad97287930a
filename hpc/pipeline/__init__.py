"""Pipelines: stages defined in Python, planned as pure data, submitted through submitit.

Usage::

    from hpc.pipeline import PipelineDef, StageDef
    PIPELINE = PipelineDef("mine", MyConfig, stages)   # stages(cfg) -> [StageDef("train", "mypkg.jobs:train"), ...]

    python -m hpc.submit mypkg.pipeline --dry-run      # the plan and every sbatch script, nothing submitted

Flow: config -> plan (plan.py, pure: JobSpecs that render their own sbatch text) -> submission
(submission.py: snapshot, manifest) -> launch (launcher.py, the one path for runs, sweeps and
`--cluster here`: tasks, dependencies, sbatch through submitit, ids recorded) -> in each task,
StageTask (executor.py) enters the snapshot, imports the stage's function and writes the done marker.

Parts::

    pipedef.py     PipelineDef, StageDef, the registry of pipelines (plan.py re-exports them)
    plan.py        make_plan -> Plan of JobSpecs that render their own sbatch text
    resources.py   a stage's resources as the plan takes them: its section and container checked, its notes
    arrays.py      a stage's items as sbatch arrays within MaxArraySize; per-item dependencies (aftercorr at
                   the upstream tasks' ids, --array=3,7,12-20)
    sbatch.py      Resources -> submitit parameters and the sbatch text they produce
    earlysignal.py the plan's note for a time-limit signal due so soon after the start that it may reach no task
    executor.py    StageTask, what submitit pickles; the executor of each kind
    arraytasks.py  an array's task pickles in one file, each unpacked by its task's batch step
    packing.py     stages.X.pack: k items per job, planned against the partition's GPUs per node
    packrun.py     a packed job's driver: each unfinished item as its own srun step
    packstop.py    its items' stop requests settled as one: the job requeued once
    packretry.py   a failed item's step alone started again in the job (a restart in place)
    options.py     Option: a pipeline's own options of python -m hpc.submit and hpc.submit(), as overrides
    request.py     Request: one submission, typed, as python -m hpc.submit takes it
    submission.py  start(): the engine python -m hpc.submit, hpc.submit() and sweeps call
    runbook.py     a run's Book: its tasks, afterok on the upstream tasks, ids recorded in the manifest
    jobcode.py     the code snapshot a submission takes (or reuses) and where each task imports from
    launcher.py    launch(plan, book, backend): the one function that starts a plan's jobs; submitit's Backend
    short.py       define()/stage(): a PipelineDef from plain functions (hpc.define, hpc.stage)

Everything but executor.py's task imports without torch: --dry-run stays fast.
"""
from typing import Any

# What a pipeline module imports; loaded on first use, so that the stage task (what every job
# unpickles) does not load the planner.
PUBLIC = {"PipelineDef": "pipedef", "StageDef": "pipedef", "StageContext": "executor", "Request": "request",
          "submit": "submission", "define": "short", "stage": "short"}


def __getattr__(name: str) -> Any:
    if name not in PUBLIC:
        raise AttributeError(f"module 'hpc.pipeline' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"hpc.pipeline.{PUBLIC[name]}"), name)
