"""A `run` task runs once whatever happens after its work is whole, on the local SLURM cluster with
2 ranks: a rank whose interpreter ended normally and then died in its teardown (as gloo's threads make
a script that never destroyed its process group die now and then: "terminate called without an active
exception", SIGABRT) counts as a normal exit, not as a failure restarted in place; and a requeue of the
job after its task wrote its done marker (a preemption in its last moment) runs nothing again.

    python -m pytest tests/slurm/test_script_exit.py -m slurm
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpc import submit
from hpc.cluster.preempt import job_field
from hpc.rundir.run import RunDir
from tests.slurm.requeue_helpers import release, wait_for

pytestmark = pytest.mark.slurm

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}
# No torch: the crash is the C library's exit functions calling abort(), after Python's teardown and
# after hpc's exit function, where C++'s destructors of gloo's threads abort a process.
SCRIPT = """\
import ctypes, os
with open(f"starts-{os.environ['RANK']}", "a") as fh:  # each start of each rank: the attempt's restart count
    fh.write(os.environ.get("SLURM_RESTART_COUNT", "0") + "\\n")
libc = ctypes.CDLL("libc.so.6")
libc.on_exit(libc.abort, None)
"""


def starts(work: Path) -> dict:
    return {p.name.split("-")[1]: p.read_text().split() for p in sorted(work.glob("starts-*"))}


def test_a_finished_task_runs_once_through_a_crash_at_exit_and_a_requeue(slurm_cluster, tmp_path, monkeypatch):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "abort_at_exit.py").write_text(SCRIPT)
    monkeypatch.chdir(project)
    run_dir = tmp_path / "run"
    assert submit.main(["run", "--cluster", "slurm", "--run-dir", str(run_dir), "--tasks-per-node", "2",
                        "stages.main.cpus_per_task=1", "--", sys.executable, "abort_at_exit.py"]) == 0
    job = RunDir(run_dir).tasks()[-1]["job_id"]
    work, logs = run_dir / "main" / "work", run_dir / "main" / "logs" / job
    wait_for(lambda: job_field(slurm_cluster, job, "JobState") in ENDED, "the job to end", timeout=180)
    err = (logs / f"{job}_1_log.err").read_text()
    assert job_field(slurm_cluster, job, "JobState") == "COMPLETED", err[-3000:]
    assert "rank 1: the script ended normally, then died of SIGABRT in its interpreter's teardown" in err
    assert starts(work) == {"0": ["0"], "1": ["0"]}, err[-3000:]  # once each: nothing restarted in place

    subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True)
    release(slurm_cluster, job)
    wait_for(lambda: job_field(slurm_cluster, job, "JobState") in ENDED, "the requeued job to end", timeout=180)
    out = (logs / f"{job}_0_log.out").read_text()
    assert job_field(slurm_cluster, job, "JobState") == "COMPLETED", out[-3000:]
    assert job_field(slurm_cluster, job, "Restarts") == "1"
    assert starts(work) == {"0": ["0"], "1": ["0"]}, out[-3000:]  # the script did not run again
    assert "main finished already (its done marker" in out and "not run again" in out, out[-3000:]
