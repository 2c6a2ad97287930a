"""`--cluster here` on the real local SLURM cluster: LangSplat's sandbox run as srun steps of one
`salloc -N 2 --ntasks-per-node=2 --gres=gpu:2`, interrupted with Ctrl-C (SIGINT) mid-features and run
again, every rank in the container stand-in of tests/box.py (the `exec` runtime under bubblewrap: no
SLURM client, and no hpc but the copy hpc carries in), so the same run shows that a stage in a container
stops and resumes in an allocation. python -m pytest tests/slurm/test_here.py -m slurm
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hpc
from hpc.rundir.run import RunDir
from tests.box import boxed
from tests.slurm.test_langsplat import LEVEL, MINI
from tests.slurm.test_pipeline import wait_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slurm
# features long enough (on 4 ranks) that the Ctrl-C lands between its first checkpoint and its end
TRAINER = {**MINI, "feature_iterations": 400, "checkpoint_every": 50, "log_every": 50}


def salloc() -> str:
    """An allocation with no shell: its id, as an salloc shell would have it in SLURM_JOB_ID."""
    out = subprocess.run(["salloc", "--no-shell", "-N", "2", "--ntasks-per-node=2", "--gres=gpu:2", "-t", "10",
                          "-J", "hpc-here-test"], capture_output=True, text=True, timeout=120)
    found = re.search(r"Granted job allocation (\d+)", out.stderr)
    assert found, out.stderr
    return found.group(1)


def test_langsplat_in_an_allocation_stops_on_ctrl_c_and_resumes(slurm_cluster, tmp_path):
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 1))
    job = salloc()
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "hpc.submit", "langsplat", "--profile", "sandbox", "--levels", str(LEVEL),
               "--cluster", "here", "--run-dir", str(run_dir),
               *(f"langsplat.trainer.{k}={v}" for k, v in TRAINER.items()), *boxed()]
    env = {**os.environ, "SLURM_JOB_ID": job}
    try:
        first = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
        checkpoints = run_dir / "features" / f"task-{LEVEL}" / "checkpoints"
        wait_until(lambda: list(checkpoints.glob("step-*/")) or first.poll() is not None, timeout_s=240,
                   what="a first feature checkpoint")
        first.send_signal(signal.SIGINT)  # what Ctrl-C in the salloc shell sends
        said = first.communicate(timeout=180)[0]
        assert first.returncode == 130, said
        assert "interrupted: the stopped tasks saved their checkpoints" in said and "stage rgb: done" in said
        steps = [line for line in said.splitlines() if re.match(r"\s+note: stage (rgb|features#?\d*): ", line)]
        assert len(steps) == 2 and all(" bwrap --die-with-parent " in t and "/carry/" in t for t in steps), said
        assert "hpc for the containers: " in said  # boxed, with hpc carried in
        run = RunDir(run_dir)
        assert run.is_done("rgb") and not run.is_done("features", LEVEL)
        stopped = hpc.Run.attach(run_dir).status()
        assert {r["task"]: r["state"] for r in stopped} == {"rgb": "COMPLETED", f"features[{LEVEL}]": "FAILED"}
        assert "stopped by Ctrl-C (--cluster here)" in next(r for r in stopped if r["stage"] == "features")["error"]

        second = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stdout + second.stderr
        assert "skip rgb: done marker present" in second.stdout and "stage rgb:" not in second.stdout.split("plan")[-1]
        metrics = json.loads((run.task_dir("features", LEVEL) / "metrics.json").read_text())
        assert 0 < metrics["resumed_from"] < TRAINER["feature_iterations"], metrics
        assert metrics["world_size"] == 4
        rows = hpc.Run.attach(run_dir).status()
        assert {r["task"]: r["state"] for r in rows} == {"rgb": "COMPLETED", f"features[{LEVEL}]": "COMPLETED"}
        tasks = {t["stage"]: [j["job_id"] for j in t["jobs"]] for t in run.tasks()}
        assert tasks == {"rgb": [f"{job}.h1"], "features": [f"{job}.h2", f"{job}.h3"]}

        # no sbatch: the allocation is the only job since the test began, and its steps are the tasks
        def steps():
            out = subprocess.run(["sacct", "-n", "-P", "-j", job, "-o", "JobID,JobName"], capture_output=True,
                                 text=True, check=True).stdout
            return sorted(line.split("|")[1] for line in out.splitlines() if re.match(rf"{job}\.\d+\|", line))
        assert wait_until(lambda: len(steps()) == 3 and steps(), what="sacct to list the steps") == [
            "hpc-features", "hpc-features", "hpc-rgb"]
        # sacct -S also lists an earlier test's job that was still ending then: only those submitted since count
        listed = subprocess.run(["sacct", "-n", "-P", "-X", "-a", "-S", since, "-o", "JobID,Submit"],
                                capture_output=True, text=True, check=True).stdout.split()
        jobs = [jid for jid, submitted in (row.split("|") for row in listed) if submitted >= since]
        assert jobs == [job]
    finally:
        subprocess.run(["scancel", job], check=False)
