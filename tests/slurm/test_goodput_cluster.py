"""The run reports itself, end to end on the local cluster: one run that is preempted, hangs (the
watchdog's verdict), has a task that fails, and completes once that task is submitted again.
A real HTTP server on 127.0.0.1 gets its webhooks (hpc.rundir.notify): requeued, hang, stage
completed, task failed, then stage and run completed, exactly once each and in order; beside it a
command sink that never answers is logged once. python -m hpc.status RUN --cost (hpc.monitor.cost)
accounts every CPU-hour of it: the parts of each task and of the run add up to sacct's allocation,
and the training's figures match what was injected.

    python -m pytest tests/slurm/test_goodput_cluster.py -m slurm

Tolerances (a 2-core machine shared by several clusters): the training that counts is the steps' own
time, TOTAL x step_s, less 1 s per attempt (sacct's Start and End have whole seconds, and an attempt's
span is cut at its End) and up to 1.6x that + 5 s (each step's compute and the loop's own work on a
loaded machine); the start-up of each attempt at least the injected sleep; nothing redone after the
preemption, since hpc's loop checkpoints the step it stops at, but the steps after the hung attempt's
checkpoint are; the parts add up to sacct's (End - Start) x CPUs of each attempt within a
millisecond's worth of unit-hours.
"""
import json
import os
from pathlib import Path

import pytest

import hpc
from hpc import status as status_cmd
from hpc.cluster.preempt import job_field, preempt
from hpc.monitor.goodput import PARTS
from hpc.rundir import attempts
from hpc.rundir.run import RunDir
from hpc.slurm import scheduler
from tests.slurm.pipelines import register
from tests.slurm.requeue_helpers import release, wait_for
from tests.test_notify import Hook

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slurm
TOTAL, STEP_S, SAVE_EVERY, STARTUP_S, CPUS, HANG_AT = 40, 0.25, 10, 3.0, 2, 25


def progress(task: Path) -> dict:
    try:
        return json.loads((task / "progress.json").read_text())
    except (OSError, ValueError):
        return {"step": 0, "restart": -1}


def test_a_preempted_hung_run_with_a_failed_task_tells_each_event_once_and_accounts_every_hour(
        slurm_cluster, tmp_path, monkeypatch, capsys, request):
    register(monkeypatch, gp="tests.goodput_pipeline")
    from hpc import submit

    run_dir, hook = tmp_path / "run", Hook()
    request.addfinalizer(hook.close)
    args = ["gp", "--cluster", "slurm", "--run-dir", str(run_dir), f"gp.steps={TOTAL}", f"gp.step_s={STEP_S}",
            f"gp.save_every={SAVE_EVERY}", f"gp.startup_s={STARTUP_S}", f"gp.hang_at={HANG_AT}", "gp.watchdog_s=3",
            "gp.parts=[0,1]", "stages.train.max_restarts_in_place=0", f"notify.webhook={hook.url}",
            "notify.command=[sh,-c,'sleep 30']", "notify.timeout_s=2"]
    assert submit.main([*args, "gp.fail_items=[1]"]) == 0
    run = RunDir(run_dir)
    job, where = run.tasks()[0]["job_id"], run.task_dir("train")
    wait_for(lambda: progress(where)["step"] >= 15, "step 15 of the first attempt")
    preempt(slurm_cluster, job, release=False)
    release(slurm_cluster, job)
    wait_for(lambda: (where / "hangs").is_dir() and restarts(slurm_cluster, job) == 2, "the hang's requeue")
    release(slurm_cluster, job)
    checks = [t["job_id"] for t in run.tasks() if t["stage"] == "check"]
    wait_for(lambda: ended(checks), "the check tasks to end", timeout=300)
    assert [t["state"] for t in hpc.Run.attach(run_dir).status()] == ["COMPLETED", "COMPLETED", "FAILED"]
    # the failed task again, now passing: its stage and the run complete, each told once
    assert submit.main([*args, "gp.fail_items=[]"]) == 0
    again = [j["job_id"] for t in run.tasks() for j in t["jobs"]][-1]
    wait_for(lambda: ended([again]), "the check task submitted again to end")
    wait_for(lambda: len(hook.bodies) >= 6, "the run's messages")
    assert hook.events() == [("requeued", "train"), ("hang", "train"), ("stage_completed", "train"),
                             ("task_failed", "check[1]"), ("stage_completed", "check"), ("run_completed", "run")]
    assert hook.bodies[0]["detail"].startswith("preempt:"), hook.bodies[0]
    assert "rank 1 on" in hook.bodies[1]["detail"] and hook.bodies[1]["detail"].endswith("; requeued"), hook.bodies[1]
    assert "check: item 1 failing on request" in hook.bodies[3]["detail"], hook.bodies[3]
    # the command sink never answers in its 2 s: each job waits for it no longer, and its failure is
    # logged once in the run, whatever the attempts, tasks and events
    logs = "".join(p.read_text() for p in run_dir.glob("*/**/logs/**/*_log.err"))
    assert logs.count("[hpc] notify: the command sink failed") == 1 and "TimeoutExpired" in logs, logs[-2000:]
    entries = attempts.load(where)
    assert len(entries) == 3 and entries[0]["end"] == "stopped" and entries[2]["end"] == "completed", entries
    assert entries[1]["resumed"] >= 15 and entries[2]["resumed"] >= HANG_AT - SAVE_EVERY, entries

    capsys.readouterr()  # the submission's lines
    assert status_cmd.main([str(run_dir), "--cost", "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    said = f"{cost} {[{k: v for k, v in e.items() if k != 'software'} for e in entries]}"
    jobs = {t["stage"] + str(t["item"]): [j["job_id"] for j in t["jobs"]] for t in run.tasks()}
    history = scheduler.history([j for ids in jobs.values() for j in ids])
    spans = {k: [scheduler_epoch(r["End"]) - scheduler_epoch(r["Start"]) for j in ids for r in history[j]]
             for k, ids in jobs.items()}
    rows = {r["task"]: r for r in cost["tasks"]}
    assert [rows[k]["attempts"] for k in ("train", "check[0]", "check[1]")] == [3, 1, 2] == \
        [len(spans[k]) for k in ("trainNone", "check0", "check1")], said
    cpus = {"train": CPUS, "check[0]": 1, "check[1]": 1}
    for key, mine in zip(cpus, spans.values()):  # each task: sacct's allocation, and its parts add up to it
        hours = rows[key]["cpu_hours"]
        assert hours["allocated"] * 3600 == pytest.approx(sum(mine) * cpus[key], abs=2 * cpus[key] * len(mine))
        assert sum(hours[k] for k in PARTS) == pytest.approx(hours["allocated"], abs=1e-5), said
    whole = cost["run"]["cpu_hours"]  # the run: every CPU-hour of every attempt of every task, once
    assert whole["allocated"] == pytest.approx(sum(rows[k]["cpu_hours"]["allocated"] for k in cpus), abs=1e-5)
    assert sum(whole[k] for k in PARTS) == pytest.approx(whole["allocated"], abs=1e-5), said
    hours = {k: v * 3600 / CPUS for k, v in rows["train"]["cpu_hours"].items()}  # wall seconds of train's 2 CPUs
    assert TOTAL * STEP_S - 3 <= hours["training"] <= TOTAL * STEP_S * 1.6 + 5, said
    assert hours["startup"] >= 3 * STARTUP_S and hours["checkpoint"] > 0 and hours["teardown"] > 0, said
    assert hours["redone"] > 0, said  # the hung attempt's steps after its checkpoint ran again
    assert rows["check[1]"]["cpu_hours"]["failures"] > 0 and 0 < rows["train"]["goodput"] < 1, said
    # the picture: each attempt's bar with its start-up and teardown strips (HPC_UPDATE_GOLDEN=1: into the docs)
    picture = ROOT / "docs" / "goodput-timeline.svg" if os.environ.get("HPC_UPDATE_GOLDEN") else tmp_path / "run.svg"
    assert status_cmd.main([str(run_dir), "--timeline", str(picture)]) == 0
    svg = picture.read_text()
    assert "start-up (job start to first step)" in svg and "stop and teardown" in svg and svg.count("attempt-train-") == 3


def restarts(cluster, job: str) -> int:
    return int(job_field(cluster, job, "Restarts") or 0)


def ended(jobs: list) -> bool:
    states = scheduler.query(jobs)
    return all(getattr(states.get(j), "state", "") in ("COMPLETED", "FAILED") for j in jobs)


def scheduler_epoch(text: str) -> float:
    from hpc.monitor.timeline import _epoch

    return _epoch(text)
