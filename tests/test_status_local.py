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


def rows(run_dir: Path, env: dict) -> list:
    """The rows python -m hpc.status RUN_DIR --json prints, run with `env` (a sweep's: one per point)."""
    done = subprocess.run([sys.executable, "-m", "hpc.status", str(run_dir), "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def states(run_dir: Path, env: dict) -> list:
    return [row["state"] for row in rows(run_dir, env)]


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


def test_a_local_sweeps_points_are_running_while_their_tasks_run_then_completed_or_failed(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env["HPC_CACHE_DIR"] = str(tmp_path / "cache")
    sweep, release = tmp_path / "sweep", tmp_path / "release"
    # two points, stage first then stage second; second[0] waits for the release file, then fails in one point
    submission = subprocess.Popen(
        [sys.executable, "-m", "hpc.submit", "tests.tiny_pipeline", "--cluster", "local", "--run-dir", str(sweep),
         "tiny.parts=[0]", "tiny.slow_items=[0]", f"tiny.release_file={release}", "--sweep", "tiny.fail_items=[],[0]"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:  # both points' second task working: their logs say so
        wait_for(lambda: sum(b"working" in p.read_bytes() for p in sweep.glob("second/logs/*/*_0_log.out")) == 2,
                 "both points' second task to start", timeout=120)
        points = {bool(row["overrides"]["tiny.fail_items"]): row["point"] for row in rows(sweep, env)}
        assert states(sweep, env) == ["RUNNING", "RUNNING"]  # was NOT SUBMITTED, 0/0
        for point in points.values():  # and each point as a run: its first task done, its second running
            assert states(sweep / point, env) == ["COMPLETED", "RUNNING"]  # was: no manifest.json
        for point in points.values():  # as if their tasks had not linked their logs yet, as one that fails
            (sweep / point / "second" / "logs").unlink()  # on a failed upstream never does: the sweep's are read
        assert states(sweep, env) == ["RUNNING", "RUNNING"]
        assert [states(sweep / point, env) for point in points.values()] == [["COMPLETED", "RUNNING"]] * 2
        release.touch()
        said = submission.communicate(timeout=120)[0]
    finally:
        release.touch()
        submission.kill() if submission.poll() is None else None
    assert submission.returncode != 0, said  # one point failed
    assert states(sweep / points[False], env) == ["COMPLETED", "COMPLETED"]
    assert states(sweep / points[True], env) == ["COMPLETED", "FAILED"]  # was UNKNOWN without the link
    assert {row["point"]: row["state"] for row in rows(sweep, env)} == {points[False]: "COMPLETED",
                                                                         points[True]: "FAILED"}
