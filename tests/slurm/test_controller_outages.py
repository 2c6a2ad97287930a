"""The sandbox's own daemons stopped under a run (LocalCluster.stop_daemon): slurmctld stopped and
started again mid-training, then SLURM's time-limit warning; slurmdbd stopped while a run works and a
user asks for its status and submits it again.

    python -m pytest -n 0 tests/slurm/test_controller_outages.py -m slurm

faults.outages plays the same on more runs (python -m faults.reliability --only 'stopped').
"""
from __future__ import annotations

import json
import time

import pytest

from faults.slurmshim import SlurmShim
from hpc.cluster.preempt import job_field
from hpc.rundir.run import RunDir
from tests.slurm.requeue_helpers import SIGNAL_SCRIPT, events, release, steps_of, submit_run, wait_for
from tests.slurm.test_flaky_controller import _hpc

pytestmark = pytest.mark.slurm
STEPS = 200  # 0.5 s each before the first requeue (the time-limit warning comes first), 0.05 s after
# SLURM's warning at a 2-minute limit comes 30 to 60 s after the start: before the script ends
TIME_LIMIT = ("stages.main.time_min=2", "stages.main.signal_delay_s=60", "stages.main.max_timeouts=1")
SCRIPT = SIGNAL_SCRIPT.replace("100000", str(STEPS)).replace("sleep(0.5)", "sleep(0.5 if restart == '0' else 0.05)")


def test_a_job_survives_a_slurmctld_restart_and_the_time_limit_warning_after_it_is_requeued(slurm_cluster,
                                                                                            tmp_path):
    """2-minute limit, warning 60 s before it (SLURM sends it 30 to 60 s after the start): slurmctld
    is stopped for a few seconds before that, the job's ranks step on meanwhile, and the warning
    from the restarted controller is still decided (timeout), recorded with what SLURM did, and
    requeued; the rerun resumes from the ranks' counts and completes, submitted once."""
    (tmp_path / "count.py").write_text(SCRIPT)
    run_dir, ckpt = tmp_path / "run", tmp_path / "run" / "main" / "checkpoints"
    job_id = submit_run(run_dir, tmp_path / "count.py", *TIME_LIMIT)
    wait_for(lambda: steps_of(ckpt, 0) >= 3 and steps_of(ckpt, 1) >= 3, "both ranks stepping")
    assert slurm_cluster.stop_daemon("slurmctld")
    try:
        before = steps_of(ckpt, 1)
        wait_for(lambda: steps_of(ckpt, 1) >= before + 6, "the ranks stepping while slurmctld is down", timeout=30)
    finally:
        slurm_cluster.start_daemon("slurmctld")
    assert job_field(slurm_cluster, job_id, "JobState") == "RUNNING" and not events(ckpt)
    wait_for(lambda: events(ckpt), "the decision at the time-limit warning", timeout=120)
    [event] = events(ckpt)
    assert (event["kind"], event["requeue"], event["by"]) == ("timeout", True, "hpc"), event
    assert event["slurm"] == "queued again by scontrol requeue", event
    wait_for(lambda: job_field(slurm_cluster, job_id, "Restarts") == "1", "the requeue", timeout=60)
    release(slurm_cluster, job_id)
    wait_for(lambda: job_field(slurm_cluster, job_id, "JobState") == "COMPLETED", "the rerun to finish", timeout=120)
    assert steps_of(ckpt, 0) == steps_of(ckpt, 1) == STEPS
    assert [j["job_id"] for j in RunDir(run_dir).tasks()[0]["jobs"]] == [job_id]
    assert job_field(slurm_cluster, job_id, "Restarts") == "1"


def name(task: dict) -> str:
    """A manifest task as hpc.status names it: `first`, `second[1]`."""
    return task["stage"] if task.get("item") is None else f"{task['stage']}[{task['item']}]"


def status(run_dir, env) -> tuple:
    """(seconds `python -m hpc.status --json` took, its states by task, its stderr)."""
    start = time.monotonic()
    out = _hpc("hpc.status", str(run_dir), "--json", env=env)
    assert out.returncode == 0, out.stderr
    return time.monotonic() - start, {r["task"]: r["state"] for r in json.loads(out.stdout)}, out.stderr


def test_while_slurmdbd_is_down_status_answers_and_a_resubmission_neither_duplicates_nor_reruns(slurm_cluster,
                                                                                                 tmp_path):
    """A tiny run whose second[1] works until a file appears: with slurmdbd stopped, hpc.status answers
    from squeue within seconds and says accounting is unreachable, and the same run submitted again
    submits nothing (first and second[0] are done, second[1] is running); the run then completes,
    each task run once under its one job."""
    shim = SlurmShim(tmp_path / "shim")  # no faults: it counts the calls
    go = tmp_path / "go"
    args = ["tiny", "--cluster", "slurm", "--run-dir", str(tmp_path / "run"), "tiny.parts=[0,1]",
            "tiny.slow_items=[1]", f"tiny.release_file={go}"]
    assert _hpc("hpc.submit", *args, env=shim.env()).returncode == 0
    run = RunDir(tmp_path / "run")
    jobs = {name(t): t["job_id"] for t in run.tasks()}
    wait_for(lambda: status(run.path, shim.env())[1] == {"first": "COMPLETED", "second[0]": "COMPLETED",
                                                          "second[1]": "RUNNING"}, "second[1] working alone")
    assert slurm_cluster.stop_daemon("slurmdbd")
    try:
        took, states, said = status(run.path, shim.env())
        assert took < 15, f"{took:.0f} s"
        assert states == {"first": "COMPLETED", "second[0]": "COMPLETED", "second[1]": "RUNNING"}, said
        assert said.count("[hpc] accounting unreachable (") == 1 and "Connection refused" in said, said
        again = _hpc("hpc.submit", *args, env=shim.env())
        assert again.returncode == 0, again.stdout + again.stderr
        assert len(shim.calls("sbatch")) == 2, again.stdout  # the two of the first submission only
        assert len(shim.calls("sacct")) >= 2  # asked, and failed: the answers came from squeue
        go.write_text("")
        wait_for(lambda: status(run.path, shim.env())[1]["second[1]"] == "COMPLETED", "second[1] to finish")
    finally:
        slurm_cluster.start_daemon("slurmdbd")
    assert len(shim.calls("sbatch")) == 2
    after = {name(t): [j["job_id"] for j in t["jobs"]] for t in RunDir(run.path).tasks()}
    assert after == {task: [job] for task, job in jobs.items()}
    for job in jobs.values():
        assert job_field(slurm_cluster, job, "Restarts") == "0"
