"""Submit limits on a cluster that enforces them (python -m hpc.cluster up --limits --max-submit-jobs N):
a run the limit cannot take whole is refused before its first sbatch, in one line with the numbers.

    python -m pytest -n 0 tests/slurm/test_submit_limits.py
"""
from __future__ import annotations

import getpass
import subprocess
import sys
from pathlib import Path

import pytest

from hpc import submit
from hpc.cluster import LocalCluster
from hpc.rundir.run import RunDir
from tests.slurm.pipelines import register

pytestmark = pytest.mark.slurm


@pytest.fixture
def limited(limits_cluster, site_env, monkeypatch, tmp_path):
    """The limits cluster's shell, a user cache of this test's own (the limit read is kept there),
    and an empty queue at the start and the end."""
    register(monkeypatch, tiny="tests.tiny_pipeline")
    monkeypatch.setenv("HPC_CACHE_DIR", str(tmp_path / "cache"))
    site_env(limits_cluster)
    limits_cluster.run(["scancel", "-u", getpass.getuser()], check=False)
    yield limits_cluster
    limits_cluster.run(["scancel", "-u", getpass.getuser()], check=False)


def set_submit_limit(cluster: LocalCluster, jobs: int) -> None:
    """As a site admin would, through the command a user runs: QOS normal's MaxSubmitJobsPerUser."""
    subprocess.run([sys.executable, "-m", "hpc.cluster", "up", "--dir", str(cluster.dir),
                    "--max-submit-jobs", str(jobs)], check=True, capture_output=True, text=True)


def queued(cluster: LocalCluster) -> list:
    return cluster.run(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i"]).stdout.split()


def submit_tiny(run_dir: Path) -> int:
    return submit.main(["tiny", "--cluster", "slurm", "--run-dir", str(run_dir), "tiny.parts=[0,1,2,3]",
                        "tiny.sleep_s=30"])


def test_the_sandbox_counts_each_array_task_against_the_limit(limited):
    set_submit_limit(limited, 3)
    refused = limited.run(["sbatch", "--array=0-3", "--output=/dev/null", "--wrap", "sleep 30"], check=False)
    assert refused.returncode == 1
    assert "QOSMaxSubmitJobPerUserLimit" in refused.stderr
    assert limited.run(["sbatch", "--array=0-2", "--output=/dev/null", "--wrap", "sleep 30"]).returncode == 0
    assert len(queued(limited)) == 3


def test_a_run_past_the_limit_is_refused_before_any_sbatch(limited, tmp_path, capsys):
    set_submit_limit(limited, 3)
    assert submit_tiny(tmp_path / "run") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "this run needs 5 jobs in the queue at once (1 + an array of 4); QOS normal's " \
           "MaxSubmitJobsPerUser allows 3 per user and you have 0 queued" in err
    assert "HINT:" in err
    assert queued(limited) == []


def test_a_run_within_the_limit_is_submitted(limited, tmp_path, capsys):
    set_submit_limit(limited, 5)
    assert submit_tiny(tmp_path / "run") == 0
    assert len(queued(limited)) == 5


def test_a_sweep_past_the_limit_is_refused_before_any_sbatch(limited, tmp_path, capsys):
    set_submit_limit(limited, 3)
    code = submit.main(["tiny", "--cluster", "slurm", "--run-dir", str(tmp_path / "sweep"), "tiny.parts=[0]",
                        "--sweep", "tiny.score=1,2"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "this run needs 4 jobs in the queue at once (an array of 2 + an array of 2)" in err, err
    assert len(err.splitlines()) == 1
    assert queued(limited) == []


def test_a_limit_hpc_cannot_read_says_what_was_queued_and_what_not(limited, tmp_path, capsys):
    """GrpSubmit (the QOS's total, all users together) is not read: sbatch refuses the second stage."""
    set_submit_limit(limited, 0)
    limited.run(["sacctmgr", "-i", "modify", "qos", "where", "name=normal", "set", "GrpSubmit=3"])
    try:
        assert submit_tiny(tmp_path / "run") == 2
    finally:
        limited.run(["sacctmgr", "-i", "modify", "qos", "where", "name=normal", "set", "GrpSubmit=-1"])
    err = capsys.readouterr().err
    first = RunDir(tmp_path / "run").tasks()
    assert [t["stage"] for t in first] == ["first"]
    assert f"submitted in part: queued first ({first[0]['job_id']}); not submitted: second. HINT:" in err, err
    assert "the scheduler refused" in err.strip().splitlines()[-1]
