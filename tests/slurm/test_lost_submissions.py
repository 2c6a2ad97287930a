"""A submission hpc lost track of is found by its token, shown by hpc.status, and never queued twice: the
real clients wrapped by faults.slurmshim, or the submitting process killed -9 while its sbatch runs.

    python -m pytest tests/slurm/test_lost_submissions.py
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faults.slurmshim import INVALID_PARTITION, QUEUED_THEN_TIMEOUT, TIMEOUT, SlurmShim, hang
from hpc.rundir import intents
from hpc.rundir.run import RunDir
from hpc.slurm import scheduler
from tests.slurm.test_flaky_controller import HOLD, ROOT, TINY, _hpc
from tests.slurm.test_submit_once import queued_by

pytestmark = pytest.mark.slurm
PARTS = "tiny.parts=[0,1]"
LATER = "stages.first.extra.begin=now+20"  # `first` starts once hpc has found it: then it must run


def runs(run_dir: Path, job: str) -> None:
    """Wait until the job found by its token runs `first`: its log folder made, its pickle found."""
    deadline, state = time.monotonic() + 90, ""
    while time.monotonic() < deadline and state not in ("RUNNING", "FAILED", "COMPLETED"):
        time.sleep(1)
        state = subprocess.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"], capture_output=True,
                               text=True).stdout.strip()
    assert state == "RUNNING", state
    log = run_dir / "first" / "logs" / job / f"{job}_0_log.out"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and b"[hpc] stage first" not in (log.read_bytes() if log.exists() else b""):
        time.sleep(0.5)
    assert b"[hpc] stage first" in log.read_bytes()


@pytest.fixture
def site(slurm_cluster, site_env, tmp_path):
    """The session cluster's shell; every job queued from under tmp_path is cancelled after the test."""
    site_env(slurm_cluster)
    yield tmp_path
    scheduler.cancel(list(queued_by(tmp_path)))


def submit(run_dir: Path, env: dict) -> subprocess.CompletedProcess:
    return _hpc("hpc.submit", "tiny", "--cluster", "slurm", "--run-dir", str(run_dir), PARTS, *HOLD[1:], LATER,
                env=env)


def status(run_dir: Path, env: dict) -> dict:
    out = _hpc("hpc.status", str(run_dir), "--json", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    return {r["task"]: r for r in json.loads(out.stdout)}


def test_a_job_whose_answer_and_lookup_were_lost_is_shown_by_status_and_not_queued_again(site):
    run_dir = site / "run"
    # sbatch queues `first` and reports a timeout; every squeue (the look-up by token) times out, unretried
    shim = SlurmShim(site / "shim").rule("sbatch", [1], QUEUED_THEN_TIMEOUT).rule("squeue", range(1, 50), TIMEOUT)
    out = submit(run_dir, {**shim.env(), "HPC_SLURM_RETRY_S": "0"})
    assert out.returncode == 2 and "may have been queued" in out.stderr, out.stdout + out.stderr
    queued = queued_by(site)
    assert len(queued) == 1, queued  # `first`, which hpc never heard of
    (job, comment), = queued.items()
    assert RunDir(run_dir).tasks() == []  # the manifest has no id for it
    assert [e["token"] for e in intents.pending(run_dir)] == [comment.split(":")[1]]  # written before sbatch

    shim.clear()
    asked = SlurmShim(site / "status-shim")  # status's own calls only: the jobs' wrappers log to `shim`
    rows = status(run_dir, asked.env())
    assert rows["first"]["job_id"] == job and rows["first"]["state"] in ("PENDING", "RUNNING"), rows
    assert rows["first"]["why"].startswith(f"found by its token {comment}"), rows["first"]
    # the tasks of `second`, never submitted, are rows too
    assert [rows[t]["state"] for t in ("second[0]", "second[1]")] == ["UNSUBMITTED"] * 2, rows
    assert rows["second[0]"]["why"].startswith("not submitted"), rows["second[0]"]
    calls = asked.calls()  # the look-up by token, and the run's one query
    assert [c[0] for c in calls] == ["squeue", "sacct"] and "--me" in calls[0], calls

    again = submit(run_dir, shim.env())
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"found by its token {comment}: job {job}" in again.stdout, again.stdout
    assert len(shim.calls("sbatch")) == 2, (again.stdout, shim.calls("sbatch"))  # only `second` now
    assert len(queued_by(site)) == 2, (queued_by(site), shim.calls())
    ids = {t["stage"]: t["job_id"] for t in RunDir(run_dir).tasks()}
    assert ids["first"] == job and intents.pending(run_dir) == []
    before = len(asked.calls())
    rows = status(run_dir, asked.env())
    assert [c[0] for c in asked.calls()[before:]] == ["sacct"]  # nothing unresolved: one call, as ever
    assert rows["first"]["why"].startswith(f"found by its token {comment}"), rows["first"]
    runs(run_dir, job)


def test_a_submission_killed_while_its_sbatch_runs_is_found_and_never_queued_twice(site):
    run_dir = site / "run"
    shim = SlurmShim(site / "shim").rule("sbatch", [1], hang(20))  # the real sbatch runs 20 s late
    code = (f"import sys, runpy; from hpc.pipeline import plan; plan.PIPELINES['tiny'] = {TINY!r}; "
            "sys.argv = ['hpc.submit', *sys.argv[1:]]; runpy.run_module('hpc.submit', run_name='__main__')")
    with open(site / "submit.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", code, "tiny", "--cluster", "slurm", "--run-dir", str(run_dir),
                                 PARTS, *HOLD[1:], LATER], env=shim.env(), cwd=ROOT, stdout=log, stderr=log)
        deadline = time.monotonic() + 120
        while not shim.calls("sbatch") and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert shim.calls("sbatch"), (site / "submit.log").read_text()
        os.kill(proc.pid, signal.SIGKILL)  # hpc dies inside sbatch; the sbatch it started goes on
        proc.wait()
    assert RunDir(run_dir).tasks() == [] and len(intents.pending(run_dir)) == 1

    early = submit(run_dir, shim.env())  # while that sbatch is still on its way: nothing is submitted
    assert early.returncode == 2 and "may still be on its way" in early.stderr, early.stdout + early.stderr
    assert len(shim.calls("sbatch")) == 1 and "Traceback" not in early.stderr

    deadline = time.monotonic() + 60
    while not queued_by(site) and time.monotonic() < deadline:
        time.sleep(0.5)
    (job, comment), = queued_by(site).items()
    rows = status(run_dir, shim.env())
    assert rows["first"]["job_id"] == job and "found by its token" in rows["first"]["why"], rows

    again = submit(run_dir, shim.env())
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(queued_by(site)) == 2 and len(shim.calls("sbatch")) == 2, (again.stdout, shim.calls())  # `second` once
    assert {t["stage"]: t["job_id"] for t in RunDir(run_dir).tasks()}["first"] == job
    runs(run_dir, job)


def test_status_shows_the_tasks_a_submission_cut_short_never_submitted(site):
    run_dir = site / "run"
    shim = SlurmShim(site / "shim").rule("sbatch", [2], INVALID_PARTITION)  # `second`'s array is refused
    out = submit(run_dir, shim.env())
    assert out.returncode == 2 and "submitted in part" in out.stderr, out.stdout + out.stderr
    assert intents.pending(run_dir) == []  # a refusal queued nothing: no token is left to look up
    asked = SlurmShim(site / "status-shim")
    rows = status(run_dir, asked.env())
    assert rows["first"]["state"] in ("PENDING", "RUNNING") and not rows["first"]["why"].startswith("found"), rows
    assert {t: (r["state"], r["job_id"]) for t, r in rows.items() if t != "first"} == {
        "second[0]": ("UNSUBMITTED", "-"), "second[1]": ("UNSUBMITTED", "-")}, rows
    assert "HINT: submit again with --run-dir" in rows["second[1]"]["why"]
    assert [c[0] for c in asked.calls()] == ["sacct"]  # nothing unresolved: the poll's one call
    table = _hpc("hpc.status", str(run_dir), env=asked.env())
    assert "2 UNSUBMITTED" in table.stdout.splitlines()[0], table.stdout


def lost_sweep_array(site: Path) -> tuple:
    """A two-point sweep whose `first` array was queued while sbatch's answer and the look-up were lost:
    (sweep dir, shim, submit args, array id, its token's comment)."""
    sweep = site / "sweep"
    shim = SlurmShim(site / "shim").rule("sbatch", [1], QUEUED_THEN_TIMEOUT).rule("squeue", range(1, 50), TIMEOUT)
    args = ["tiny", "--cluster", "slurm", "--run-dir", str(sweep), "tiny.parts=[0]", *HOLD[1:], LATER,
            "--sweep", "tiny.score=1,2"]
    out = _hpc("hpc.submit", *args, env={**shim.env(), "HPC_SLURM_RETRY_S": "0"})
    assert out.returncode == 2 and "may have been queued" in out.stderr, out.stdout + out.stderr
    (array, comment), = queued_by(site).items()  # `first` of both points, in one array hpc never heard of
    assert [e["token"] for e in intents.pending(sweep)] == [comment.split(":")[1]]
    return sweep, shim, args, array, comment


def test_a_sweep_array_whose_answer_and_lookup_were_lost_is_not_queued_again(site):
    sweep, shim, args, array, comment = lost_sweep_array(site)
    shim.clear()
    again = _hpc("hpc.submit", *args, env=shim.env())
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"found by its token {comment}: job {array}, stage first (2 task(s))" in again.stdout, again.stdout
    assert len(queued_by(site)) == 2 and len(shim.calls("sbatch")) == 2, queued_by(site)  # `second` once
    points = [p for p in sweep.iterdir() if (p / "manifest.json").exists()]
    firsts = sorted(t["job_id"] for p in points for t in RunDir(p).tasks() if t["stage"] == "first")
    assert firsts == [f"{array}_0", f"{array}_1"] and intents.pending(sweep) == [], firsts
    assert (sweep / "first" / "logs" / array).is_dir()  # where SLURM opens its tasks' logs


def test_cancel_reaches_a_job_whose_answer_and_lookup_were_lost(site):
    run_dir = site / "run"
    shim = SlurmShim(site / "shim").rule("sbatch", [1], QUEUED_THEN_TIMEOUT).rule("squeue", range(1, 50), TIMEOUT)
    out = submit(run_dir, {**shim.env(), "HPC_SLURM_RETRY_S": "0"})
    assert out.returncode == 2, out.stdout + out.stderr
    (job, _), = queued_by(site).items()
    out = _hpc("hpc.cancel", str(run_dir), env=dict(os.environ))
    assert out.returncode == 0 and job in out.stdout, out.stdout + out.stderr
    state = subprocess.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"], capture_output=True, text=True)
    assert state.stdout.strip() == "CANCELLED", state
