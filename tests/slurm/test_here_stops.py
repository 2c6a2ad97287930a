"""How a `--cluster here` step ends, on the real local SLURM cluster, typed in a real salloc shell
(tests/slurm/test_here.py's salloc_shell): Ctrl-C in one run leaves another run in the same
allocation alone; a stopped step is told what stopped it (a hang the watchdog found, the allocation's
time limit); a step that never ran its task reads FAILED with srun's words, not UNKNOWN.
python -m pytest tests/slurm/test_here_stops.py -m slurm
"""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import hpc
from hpc.recovery.hangs import HANGS, REPORT
from hpc.rundir.run import RunDir
from tests.slurm.test_here import ROOT, salloc_shell, script_run
from tests.slurm.test_pipeline import wait_until
from tests.test_status_local import states

pytestmark = pytest.mark.slurm
# a script that says it started (argv[1]), then works for argv[2] seconds
WORK = "import sys, time; open(sys.argv[1], 'w').close(); time.sleep(float(sys.argv[2]))"


def state(run_dir: Path) -> dict:
    (row,) = hpc.Run.attach(run_dir).status()
    return row


def test_ctrl_c_in_one_run_leaves_another_run_in_the_allocation_alone(slurm_cluster, tmp_path):
    """Both runs number their steps from h1 and run a stage `main`: only the names differ. While they
    run, hpc.status finds each run's own step among the allocation's (hpc.monitor.alive)."""
    with salloc_shell(tmp_path, "-N", "1", "--ntasks-per-node=2", "-t", "10") as env:
        runs = {}
        for name, seconds in (("a", "120"), ("b", "15")):
            argv = script_run(tmp_path / name, WORK) + [str(tmp_path / f"{name}.started"), seconds]
            runs[name] = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
        wait_until(lambda: all((tmp_path / f"{n}.started").exists() for n in runs), what="both scripts to start")
        assert [states(tmp_path / name, env) for name in runs] == [["RUNNING"], ["RUNNING"]]  # was UNKNOWN
        os.killpg(runs["a"].pid, signal.SIGINT)  # Ctrl-C in run a's terminal
        said = {name: proc.communicate(timeout=120)[0] for name, proc in runs.items()}
    assert runs["a"].returncode == 130, said["a"]
    assert runs["b"].returncode == 0, said["b"]
    assert state(tmp_path / "b")["state"] == "COMPLETED"
    stopped = state(tmp_path / "a")
    assert stopped["state"] == "FAILED" and "stopped by Ctrl-C (--cluster here)" in stopped["error"], stopped


def test_a_hang_is_told_as_a_hang(slurm_cluster, tmp_path):
    """The watchdog's verdict reaches the command as the rank's request; the answer, in the hang's
    report and the status, says the rank hung, not Ctrl-C, and nothing is requeued."""
    run_dir = tmp_path / "run"
    with salloc_shell(tmp_path, "-N", "2", "--ntasks-per-node=2", "-t", "10") as env:
        done = subprocess.run([sys.executable, "-m", "hpc.submit", "tests.hang_pipeline", "--cluster", "here",
                               "--run-dir", str(run_dir)], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
    assert done.returncode != 0 and "stage train: a rank hung" in done.stderr, done.stdout + done.stderr
    (report,) = [p for p in (RunDir(run_dir).task_dir("train") / HANGS).glob(f"*/{REPORT}")]
    row = state(run_dir)
    assert row["state"] == "FAILED" and "not requeued (a rank hung: the watchdog stopped the step" in row["hang"], row
    assert "Ctrl-C" not in report.read_text() and "Ctrl-C" not in row["hang"]


def test_the_allocation_s_time_limit_is_told_as_such(slurm_cluster, tmp_path):
    """At the allocation's end SLURM sends the step SIGTERM; the script's stop asks the command, which
    reads the allocation's state from SLURM (Reason=TimeLimit) and no signal of its own."""
    run_dir = tmp_path / "run"
    with salloc_shell(tmp_path, "-N", "1", "--ntasks-per-node=1", "-t", "1") as env:
        done = subprocess.run(script_run(run_dir, WORK) + [str(tmp_path / "started"), "600"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
    assert done.returncode != 0, done.stdout + done.stderr
    row = state(run_dir)
    assert row["state"] == "FAILED" and f"allocation {env['SLURM_JOB_ID']} reached its time limit" in row["error"], row
    assert f"stage main: allocation {env['SLURM_JOB_ID']} reached its time limit" in done.stderr, done.stderr
    assert "stopped by Ctrl-C" not in done.stdout + done.stderr


def test_a_step_that_never_ran_its_task_reads_failed_with_srun_s_words(slurm_cluster, tmp_path):
    """cluster.setup runs in each rank before the task: a line that fails ends the step with no result."""
    run_dir = tmp_path / "run"
    with salloc_shell(tmp_path, "-N", "1", "--ntasks-per-node=1", "-t", "10") as env:
        done = subprocess.run(script_run(run_dir, "print(1)", "cluster.setup=[exit 3]"), cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=180)
    assert done.returncode != 0, done.stdout + done.stderr
    row = state(run_dir)
    assert row["state"] == "FAILED", row
    assert "srun exited 3 with no result from the task: n1: task 0: Exited with exit code 3" in row["why"], row
    logs = subprocess.run([sys.executable, "-m", "hpc.logs", str(run_dir), "--err"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout
    assert "[hpc] srun exited 3" in logs
