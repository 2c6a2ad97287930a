"""Where an unmodified script runs under `python -m hpc.submit run`, on the real local cluster: its
task's working directory, with the submitted code, the submit directory's git-ignored data, its own
outputs kept across a preemption and a `--run-dir` resubmission after a code edit, and nothing of the
live tree importable.

    python -m pytest tests/slurm/test_run_workdir.py -m slurm
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpc import submit
from hpc.cluster.preempt import job_field, preempt
from hpc.rundir.run import RunDir
from hpc.slurm import scheduler
from tests.slurm.requeue_helpers import wait_for

pytestmark = pytest.mark.slurm

TRAIN = """\
import importlib, json, os, pathlib, signal, sys, time
import helper
restart = os.environ.get("SLURM_RESTART_COUNT", "0")
def importable(name):
    try:
        importlib.import_module(name)
        return True
    except ImportError:
        return False
out = pathlib.Path("out")
out.mkdir(exist_ok=True)
seen = sorted(p.name for p in out.glob("attempt-*.json"))
report = {"version": helper.VERSION, "data": pathlib.Path("data/set/train.bin").read_text(),
          "secret": importable("secret"), "newmod": importable("newmod"), "seen": seen,
          "cwd": os.getcwd(), "job": os.environ["SLURM_JOB_ID"]}
(out / f"attempt-{os.environ['SLURM_JOB_ID']}-{restart}.json").write_text(json.dumps(report))
if os.environ.get("WAIT_FOR_PREEMPTION") and restart == "0":
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    time.sleep(120)
if os.environ.get("WAIT_FOR_PREEMPTION") and restart == "1":
    sys.exit(3)  # the run is left unfinished, for a resubmission to resume
"""


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def make_repo(root):
    root.mkdir()
    (root / "train.py").write_text(TRAIN)
    (root / "helper.py").write_text("VERSION = 'v1'\n")
    (root / ".gitignore").write_text("*.bin\nsecret.py\n")
    (root / "data" / "set").mkdir(parents=True)
    (root / "data" / "set" / "train.bin").write_text("tokens")
    (root / "secret.py").write_text("X = 1\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v1")
    return root


def reports(run_dir):
    return {p.name: json.loads(p.read_text()) for p in (run_dir / "main" / "work" / "out").glob("attempt-*.json")}


def test_a_script_runs_in_its_working_dir_with_the_submitted_code_and_keeps_its_outputs(slurm_cluster, tmp_path,
                                                                                      monkeypatch):
    repo = make_repo(tmp_path / "proj")
    run_dir = tmp_path / "run"
    monkeypatch.chdir(repo)
    monkeypatch.setenv("WAIT_FOR_PREEMPTION", "1")
    args = ["run", "--cluster", "slurm", "--run-dir", str(run_dir), "--tasks-per-node", "1",
            "stages.main.cpus_per_task=1", "stages.main.partition=low",
            "stages.main.max_restarts_in_place=0"]  # the second attempt's failure ends the job, as it says
    assert submit.main([*args, "stages.main.extra.begin=now+600", "--", sys.executable, "train.py"]) == 0
    # the live tree moves on while the job waits: an edit, and a new module
    (repo / "helper.py").write_text("VERSION = 'v2'\n")
    (repo / "newmod.py").write_text("Y = 2\n")
    job = RunDir(run_dir).tasks()[0]["job_id"]
    scheduler.start_now(job, slurm_cluster.client_env())
    wait_for(lambda: len(reports(run_dir)) == 1, "the first attempt's report", timeout=120)
    preempt(slurm_cluster, job)
    wait_for(lambda: job_field(slurm_cluster, job, "JobState") == "FAILED", "the requeued attempt", timeout=180)
    got = reports(run_dir)
    first, second = got[f"attempt-{job}-0.json"], got[f"attempt-{job}-1.json"]
    work = run_dir / "main" / "work"
    for r in (first, second):
        assert (r["version"], r["data"], r["secret"], r["newmod"]) == ("v1", "tokens", False, False), r
        assert r["cwd"] == str(work)
    assert second["seen"] == [f"attempt-{job}-0.json"]  # the first attempt's output, found again
    snap = Path(json.loads((run_dir / "manifest.json").read_text())["snapshot"]["dir"])
    assert snap.is_dir() and not list(snap.rglob("attempt-*.json"))  # nothing written into the snapshot
    assert not (repo / "out").exists()  # nor into the live tree

    # a resubmission into the run directory after the edit: the new code, the old outputs
    monkeypatch.delenv("WAIT_FOR_PREEMPTION")
    assert submit.main([*args, "--", sys.executable, "train.py"]) == 0
    again = RunDir(run_dir).tasks()[-1]["job_id"]
    scheduler.start_now(again, slurm_cluster.client_env())  # the saved config holds the begin time
    wait_for(lambda: job_field(slurm_cluster, again, "JobState") == "COMPLETED", "the resubmitted job", timeout=180)
    third = reports(run_dir)[f"attempt-{again}-0.json"]
    assert (third["version"], third["newmod"], third["cwd"]) == ("v2", True, str(work))
    assert sorted(third["seen"]) == sorted([f"attempt-{job}-0.json", f"attempt-{job}-1.json"])
