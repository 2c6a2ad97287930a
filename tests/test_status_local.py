"""python -m hpc.status on real runs of the local executor: RUNNING while a task's process runs, then
COMPLETED or FAILED from what it left (hpc.monitor.alive, hpc.monitor.status).

    python -m pytest -n 0 tests/test_status_local.py
"""
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.slurm.requeue_helpers import wait_for

ROOT = Path(__file__).resolve().parents[1]


def states(run_dir: Path, env: dict) -> list:
    """The states python -m hpc.status RUN_DIR --json prints, run with `env`."""
    done = subprocess.run([sys.executable, "-m", "hpc.status", str(run_dir), "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [row["state"] for row in json.loads(done.stdout)]


def test_a_local_task_is_running_while_its_process_runs_then_completed_or_failed(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env["HPC_CACHE_DIR"] = str(tmp_path / "cache")
    release = tmp_path / "release"
    submissions = {}
    for name, code in (("ok", 0), ("bad", 3)):  # one task each, waiting for the release file
        script = f"while [ ! -e {release} ]; do sleep 0.1; done; exit {code}"
        submissions[name] = subprocess.Popen(
            [sys.executable, "-m", "hpc.submit", "run", "--cluster", "local", "--run-dir", str(tmp_path / name),
             "--gpus-per-node", "0", "--", "sh", "-c", script], cwd=ROOT, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for name in submissions:  # started: its rank 0 said so in its log
            wait_for(lambda: list((tmp_path / name / "main" / "logs").glob("*/*_0_log.out")), f"{name} to start")
            assert states(tmp_path / name, env) == ["RUNNING"]  # was UNKNOWN
        release.touch()
        said = {name: proc.communicate(timeout=120)[0] for name, proc in submissions.items()}
    finally:
        release.touch()
        for proc in submissions.values():
            proc.kill() if proc.poll() is None else None
    assert submissions["ok"].returncode == 0, said["ok"]
    assert submissions["bad"].returncode != 0, said["bad"]
    assert states(tmp_path / "ok", env) == ["COMPLETED"]
    assert states(tmp_path / "bad", env) == ["FAILED"]
