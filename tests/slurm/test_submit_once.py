"""Each sbatch hpc makes is queued exactly once, however the controller answers: the real sbatch wrapped
to report a timeout after queueing the job, or to fail without queueing it (faults.slurmshim).

    python -m pytest tests/slurm/test_submit_once.py
"""
import getpass
import subprocess
from pathlib import Path

import pytest

from faults.slurmshim import QUEUED_THEN_TIMEOUT, TIMEOUT, SlurmShim
from hpc.pipeline import submitonce
from hpc.rundir.run import RunDir
from hpc.slurm import scheduler
from tests.slurm.test_flaky_controller import HOLD, _hpc


def queued_by(folder: Path) -> dict:
    """{job id (an array's first): its comment} of every job in the queue whose script lies under `folder`."""
    out = subprocess.run(["squeue", "-h", "-t", "all", "-u", getpass.getuser(), "-o", "%F|%k|%o"],
                         capture_output=True, text=True, check=True).stdout
    rows = [line.split("|", 2) for line in out.splitlines() if str(folder) in line]
    return {job: comment for job, comment, _ in rows}


@pytest.fixture
def submitted(slurm_cluster, site_env, tmp_path):
    """submit(shim, *overrides): python -m hpc.submit of the tiny pipeline with the shim's sbatch; every
    job it queued is cancelled after the test."""
    site_env(slurm_cluster)

    def submit(shim: SlurmShim, *overrides: str):
        return _hpc("hpc.submit", "tiny", "--cluster", "slurm", "--run-dir", str(tmp_path / "run"), *HOLD[1:],
                    *overrides, env=shim.env())
    yield submit
    scheduler.cancel(list(queued_by(tmp_path)))


def recorded(run_dir: Path) -> dict:
    return {(t["stage"], t["item"]): t["job_id"] for t in RunDir(run_dir).tasks()}


@pytest.mark.slurm
def test_a_job_queued_before_sbatch_timed_out_is_kept_not_submitted_again(submitted, tmp_path):
    shim = SlurmShim(tmp_path / "shim").rule("sbatch", [1], QUEUED_THEN_TIMEOUT)
    out = submitted(shim, "tiny.parts=[0]")
    assert out.returncode == 0, out.stdout + out.stderr
    queued = queued_by(tmp_path)
    assert len(queued) == 2, queued  # `first` and `second`, each once
    assert set(recorded(tmp_path / "run").values()) == set(queued)
    assert all(comment.startswith(submitonce.TAG) for comment in queued.values()), queued  # squeue shows the token
    assert len(shim.calls("sbatch")) == 2 and len(shim.calls("squeue")) >= 1  # the lookup, then no retry
    assert "[hpc] sbatch: " not in out.stderr


@pytest.mark.slurm
def test_a_submission_that_timed_out_before_queueing_is_retried_and_queued_once(submitted, tmp_path):
    shim = SlurmShim(tmp_path / "shim").rule("sbatch", [1, 2], TIMEOUT)
    out = submitted(shim, "tiny.parts=[0]")
    assert out.returncode == 0, out.stdout + out.stderr
    retries = [line for line in out.stderr.splitlines() if line.startswith("[hpc] sbatch: ")]
    assert len(retries) == 2 and "Socket timed out on send/recv operation; retrying in" in retries[0], out.stderr
    queued = queued_by(tmp_path)
    assert len(queued) == 2 and set(recorded(tmp_path / "run").values()) == set(queued), queued
    assert len(shim.calls("sbatch")) == 4


@pytest.mark.slurm
def test_an_array_queued_before_sbatch_timed_out_is_one_array(submitted, tmp_path):
    shim = SlurmShim(tmp_path / "shim").rule("sbatch", [2], QUEUED_THEN_TIMEOUT)  # the second stage's array
    out = submitted(shim, "tiny.parts=[0,1]")
    assert out.returncode == 0, out.stdout + out.stderr
    queued = queued_by(tmp_path)
    assert len(queued) == 2, queued  # `first`, and one array for `second`
    ids = recorded(tmp_path / "run")
    array = sorted(set(queued) - {ids[("first", None)]})
    assert [ids[("second", 0)], ids[("second", 1)]] == [f"{array[0]}_0", f"{array[0]}_1"], (ids, queued)
    assert len(shim.calls("sbatch")) == 2



@pytest.mark.slurm
def test_a_sweep_array_queued_before_sbatch_timed_out_is_one_array(submitted, tmp_path):
    shim = SlurmShim(tmp_path / "shim").rule("sbatch", [1], QUEUED_THEN_TIMEOUT)  # `first` of both points
    out = submitted(shim, "tiny.parts=[0]", "--sweep", "tiny.score=1,2")
    assert out.returncode == 0, out.stdout + out.stderr
    queued = queued_by(tmp_path)
    assert len(queued) == 2 and len(shim.calls("sbatch")) == 2, queued  # one array per stage, each once

def test_the_lookup_finds_the_job_carrying_its_token():
    out = "41|hpc:aa11\n42|my run hpc:bb22\n43|hpc:cc33\n43|hpc:cc33\n44|(null)\n|hpc:dd44\n"
    assert submitonce.find_token(out, "bb22") == "42"  # after the job's own comment
    assert submitonce.find_token(out, "cc33") == "43"  # an array: its first job id (%F), on each task's line
    assert submitonce.find_token(out, "aa1") is None  # a token is matched whole
    assert submitonce.find_token(out, "dd44") is None and submitonce.find_token("", "aa11") is None
