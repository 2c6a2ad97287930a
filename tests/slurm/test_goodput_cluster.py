"""Goodput of a run on the local cluster with one injected preemption and a known checkpoint interval:
python -m hpc.status RUN --cost against what was injected, and the parts against sacct's allocation;
the same run's webhooks (hpc.rundir.notify) to an HTTP server on 127.0.0.1: requeued, stage and run
completed, once each, in order; beside them a command sink that never answers, logged once.

    python -m pytest tests/slurm/test_goodput_cluster.py -m slurm

Tolerances (a 2-core machine shared by several clusters): the training that counts is the steps' own
time, TOTAL x step_s, less 1 s per attempt (sacct's Start and End have whole seconds, and an attempt's
span is cut at its End) and up to 1.6x that + 5 s (each step's compute and the loop's own work on a
loaded machine); the start-up of each attempt at least the injected sleep; nothing redone, since hpc's loop
checkpoints the step it stops at; the parts add up to sacct's (End - Start) x CPUs of each attempt
within a millisecond's worth of unit-hours.
"""
import json
import os
from pathlib import Path

import pytest

from hpc import status as status_cmd
from hpc.cluster.preempt import preempt
from hpc.pipeline import plan
from hpc.rundir import attempts
from hpc.rundir.run import RunDir
from hpc.slurm import scheduler
from tests.slurm.requeue_helpers import release, wait_for
from tests.test_notify import Hook

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slurm
TOTAL, STEP_S, SAVE_EVERY, STARTUP_S, CPUS = 40, 0.25, 10, 3.0, 2


def progress(task: Path) -> dict:
    try:
        return json.loads((task / "progress.json").read_text())
    except (OSError, ValueError):
        return {"step": 0, "restart": -1}


def test_goodput_of_a_preempted_run_matches_what_was_injected(slurm_cluster, tmp_path, monkeypatch, capsys,
                                                              request):
    monkeypatch.setitem(plan.PIPELINES, "gp", "tests.goodput_pipeline")
    monkeypatch.chdir(ROOT)  # the job imports tests.goodput_pipeline from the submission directory
    from hpc import submit

    run_dir, hook = tmp_path / "run", Hook()
    request.addfinalizer(hook.close)
    assert submit.main(["gp", "--cluster", "slurm", "--run-dir", str(run_dir), f"gp.steps={TOTAL}",
                        f"gp.step_s={STEP_S}", f"gp.save_every={SAVE_EVERY}", f"gp.startup_s={STARTUP_S}",
                        f"notify.webhook={hook.url}", "notify.command=[sh,-c,'sleep 30']", "notify.timeout_s=2"]) == 0
    run = RunDir(run_dir)
    (task,) = run.tasks()
    job, where = task["job_id"], run.task_dir("train")
    wait_for(lambda: progress(where)["step"] >= 15, "step 15 of the first attempt")
    preempt(slurm_cluster, job, release=False)
    release(slurm_cluster, job)
    wait_for(lambda: getattr(scheduler.query([job]).get(job), "state", "") == "COMPLETED",
             "the requeued job to complete", timeout=300)
    wait_for(lambda: len(hook.bodies) >= 3, "the run's messages")
    assert hook.events() == [("requeued", "train"), ("stage_completed", "train"), ("run_completed", "run")]
    assert hook.bodies[0]["detail"].startswith("preempt:"), hook.bodies[0]
    # the command sink never answers in its 2 s: each job waits for it no longer, and its failure is
    # logged once in the run, whatever the attempts and events
    logs = "".join(p.read_text() for p in where.glob("logs/**/*_log.err"))
    assert logs.count("[hpc] notify: the command sink failed") == 1 and "TimeoutExpired" in logs, logs[-2000:]
    entries = attempts.load(where)
    assert [e["end"] for e in entries] == ["stopped", "completed"] and entries[1]["resumed"] >= 15

    capsys.readouterr()  # the submission's lines
    assert status_cmd.main([str(run_dir), "--cost", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["tasks"]
    hours = {k: v * 3600 / CPUS for k, v in row["cpu_hours"].items()}  # wall seconds of the 2-CPU allocation
    said = f"{hours} {[{k: v for k, v in e.items() if k != 'software'} for e in entries]}"
    history = scheduler.history([job])[job]
    spans = [(scheduler_epoch(r["End"]) - scheduler_epoch(r["Start"])) for r in history]
    assert row["attempts"] == len(spans) == 2
    assert hours["allocated"] == pytest.approx(sum(spans), abs=2)  # sacct's times have 1 s resolution
    assert sum(hours[k] for k in ("startup", "training", "redone", "checkpoint", "teardown", "failures")) == \
        pytest.approx(hours["allocated"], abs=0.01)  # each figure is rounded to 1e-6 h: 0.0018 s here
    assert TOTAL * STEP_S - 2 <= hours["training"] <= TOTAL * STEP_S * 1.6 + 5, said
    assert hours["startup"] >= 2 * STARTUP_S and hours["redone"] <= STEP_S + 1 and hours["failures"] == 0, said
    assert hours["checkpoint"] > 0 and hours["teardown"] > 0, said
    assert 0 < row["goodput"] < 1 and row["queue_wait_hours"] >= 0
    # the picture: each attempt's bar with its start-up and teardown strips (HPC_UPDATE_GOLDEN=1: into the docs)
    picture = ROOT / "docs" / "goodput-timeline.svg" if os.environ.get("HPC_UPDATE_GOLDEN") else tmp_path / "run.svg"
    assert status_cmd.main([str(run_dir), "--timeline", str(picture)]) == 0
    svg = picture.read_text()
    assert "start-up (job start to first step)" in svg and "stop and teardown" in svg and svg.count("attempt-train-") == 2


def scheduler_epoch(text: str) -> float:
    from hpc.monitor.timeline import _epoch

    return _epoch(text)
