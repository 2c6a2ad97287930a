"""A busy controller, through the user's surface: SLURM's real clients wrapped to fail on chosen calls
(faults.slurmshim), on the sandbox site without accounting (squeue answers every poll there).

    python -m pytest tests/slurm/test_flaky_controller.py
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faults.slurmshim import DBD_DOWN, EMPTY, INVALID_PARTITION, TIMEOUT, SlurmShim
from hpc.rundir.run import RunDir
from hpc.slurm import scheduler

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slurm
# tiny, with `first` working long enough that `second` is still queued behind it when we ask
TINY = "tests.tiny_pipeline"
HOLD = ["tiny.parts=[0,1]", "tiny.sleep_s=300"]


def _hpc(module: str, *args: str, env: dict) -> subprocess.CompletedProcess:
    code = (f"import sys, runpy; from hpc.pipeline import plan; plan.PIPELINES['tiny'] = {TINY!r}; "
            f"sys.argv = [{module!r}, *sys.argv[1:]]; runpy.run_module({module!r}, run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture
def queued_run(no_accounting_cluster, site_env, tmp_path):
    """A tiny run on the site without accounting whose tasks are all running or queued; cancelled after."""
    yield from _queued(no_accounting_cluster, site_env, tmp_path)


@pytest.fixture
def queued_accounting_run(slurm_cluster, site_env, tmp_path):
    """The same on the site with accounting."""
    yield from _queued(slurm_cluster, site_env, tmp_path)


def _queued(cluster, site_env, tmp_path):
    site_env(cluster)
    out = _hpc("hpc.submit", "tiny", "--cluster", "slurm", "--run-dir", str(tmp_path / "run"), *HOLD,
               env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    run = RunDir(tmp_path / "run")
    ids = [t["job_id"] for t in run.tasks()]
    assert len(ids) == 3 and all(r.state in scheduler.ACTIVE for r in scheduler.query(ids).values())
    yield run
    scheduler.cancel(scheduler.base_ids(ids))


def test_status_outlasts_a_controller_that_times_out_twice(queued_run, tmp_path):
    shim = SlurmShim(tmp_path / "shim").rule("squeue", [1, 2], TIMEOUT)
    out = _hpc("hpc.status", str(queued_run.path), "--json", env=shim.env())
    assert out.returncode == 0, out.stderr
    retries = [line for line in out.stderr.splitlines() if line.startswith("[hpc] squeue: ")]
    assert len(retries) == 2, out.stderr
    assert "slurm_load_jobs error: Socket timed out on send/recv operation; retrying in" in retries[0]
    assert len(shim.calls("squeue")) == 3
    assert {r["state"] for r in json.loads(out.stdout)} <= {"RUNNING", "PENDING"}


def test_an_empty_squeue_answer_does_not_resubmit_queued_tasks(queued_run, tmp_path):
    before = {t["job_id"] for t in queued_run.tasks()}
    shim = SlurmShim(tmp_path / "shim").rule("squeue", [1], EMPTY)
    out = _hpc("hpc.submit", "tiny", "--cluster", "slurm", "--run-dir", str(queued_run.path), *HOLD, env=shim.env())
    assert out.returncode == 0, out.stdout + out.stderr
    assert shim.calls("sbatch") == [], out.stdout  # nothing submitted a second time
    assert {t["job_id"] for t in RunDir(queued_run.path).tasks()} == before
    assert shim.calls("squeue")[0][:4] == ["squeue", "-h", "-t", "all"]  # the empty answer was the run's poll


def test_a_refused_submission_is_not_retried_and_says_so_once(no_accounting_cluster, site_env, tmp_path):
    site_env(no_accounting_cluster)
    shim = SlurmShim(tmp_path / "shim").rule("sbatch", [1, 2, 3], INVALID_PARTITION)
    out = _hpc("hpc.submit", "tiny", "--cluster", "slurm", "--run-dir", str(tmp_path / "run"), "tiny.parts=[0]",
               env=shim.env())
    assert out.returncode != 0
    assert len(shim.calls("sbatch")) == 1
    said = [line for line in out.stderr.splitlines() if line.startswith("error: ")]  # sbatch's own line above it
    assert len(said) == 1 and "Invalid partition name specified" in said[0], out.stderr
    assert "retrying" not in out.stderr and "Traceback" not in out.stderr


def test_status_answers_from_squeue_within_seconds_while_slurmdbd_is_down(queued_accounting_run, tmp_path):
    shim = SlurmShim(tmp_path / "shim").rule("sacct", range(1, 100), DBD_DOWN)
    start = time.monotonic()
    out = _hpc("hpc.status", str(queued_accounting_run.path), "--json", env=shim.env())
    took = time.monotonic() - start
    assert out.returncode == 0, out.stderr
    assert "[hpc] accounting unreachable (sacct " in out.stderr and "Connection refused" in out.stderr, out.stderr
    assert out.stderr.count("accounting unreachable") == 1
    assert {r["state"] for r in json.loads(out.stdout)} <= {"RUNNING", "PENDING"}
    assert took < 15, f"{took:.0f} s"


def test_a_controller_that_keeps_answering_nothing_gets_no_blind_resubmission(queued_run, tmp_path):
    shim = SlurmShim(tmp_path / "shim").rule("squeue", [1, 2], EMPTY)
    out = _hpc("hpc.submit", "tiny", "--cluster", "slurm", "--run-dir", str(queued_run.path), *HOLD, env=shim.env())
    assert out.returncode == 2 and shim.calls("sbatch") == [], out.stdout + out.stderr
    assert "squeue answered nothing twice" in out.stderr and "HINT: " in out.stderr and "Traceback" not in out.stderr
