"""A stop's requeue against a controller that does not answer, on the real local cluster: the `run`
pipeline's job is preempted while `scontrol requeue` times out (the real clients wrapped by
faults.slurmshim, first on the PATH that sbatch passes on to the job), and while slurmctld restarts.

    python -m pytest tests/slurm/test_requeue_faults.py -m slurm

The srun wrapper asks again within the grace time, and checkpoints/requeue.json is written once SLURM
has answered: it says what SLURM did, and where the requeue failed, what the wrapper did next.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from faults.slurmshim import RULES_ENV, TIMEOUT, SlurmShim
from hpc.cluster.preempt import job_field, preempt
from hpc.rundir.run import RunDir
from tests.slurm.requeue_helpers import SIGNAL_SCRIPT, events, release, steps_of, submit_run, wait_for

pytestmark = pytest.mark.slurm
STEPS = 80  # of 0.2 s each: the job trains for about 16 s uninterrupted
SCRIPT = SIGNAL_SCRIPT.replace("100000", str(STEPS)).replace("sleep(0.5)", "sleep(0.2)")


@pytest.fixture
def shim(tmp_path, monkeypatch) -> SlurmShim:
    """The wrapped clients first on PATH, with their rules: sbatch passes both on to the jobs."""
    wrapped = SlurmShim(tmp_path / "shim")
    for key in ("PATH", RULES_ENV):
        monkeypatch.setenv(key, wrapped.env()[key])
    return wrapped


def start(tmp_path):
    """The `run` pipeline's counting script on 2 ranks, once both are stepping: (run dir, checkpoints, job id)."""
    script = tmp_path / "count.py"
    script.write_text(SCRIPT)
    run_dir = tmp_path / "run"
    job_id = submit_run(run_dir, script)
    ckpt = run_dir / "main" / "checkpoints"
    wait_for(lambda: steps_of(ckpt, 0) >= 3 and steps_of(ckpt, 1) >= 3, "both ranks stepping")
    return run_dir, ckpt, job_id


def states(job_id: str) -> list:
    """SLURM's state of each start of the job, from accounting (sacct --duplicates)."""
    out = subprocess.run(["sacct", "-X", "-D", "-P", "-n", "-o", "State", "-j", job_id], capture_output=True,
                         text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def finished(ckpt) -> bool:
    return steps_of(ckpt, 0) == steps_of(ckpt, 1) == STEPS


def requeues(shim: SlurmShim) -> int:
    return sum(call[1:2] == ["requeue"] for call in shim.calls("scontrol"))


def test_a_requeue_that_times_out_twice_at_a_preemption_is_asked_again_and_the_job_keeps_its_place(
        slurm_cluster, shim, tmp_path):
    shim.rule("scontrol", [1, 2], TIMEOUT, arg="requeue")
    _, ckpt, job_id = start(tmp_path)
    preempt(slurm_cluster, job_id, release=False)  # a real preemption: SIGTERM, GraceTime, requeued by hpc
    release(slurm_cluster, job_id)
    wait_for(lambda: job_field(slurm_cluster, job_id, "JobState") == "COMPLETED", "the rerun to finish")
    assert finished(ckpt) and requeues(shim) == 3
    assert job_field(slurm_cluster, job_id, "Restarts") == "1"
    wait_for(lambda: len(states(job_id)) == 2, "accounting to list both starts", timeout=60)
    assert states(job_id)[-1] == "COMPLETED" and "FAILED" not in states(job_id), states(job_id)
    [event] = events(ckpt)
    assert (event["kind"], event["requeue"], event["by"]) == ("preempt", True, "hpc"), event
    assert event["slurm"] == "queued again by scontrol requeue", event


def test_a_requeue_that_always_times_out_is_recorded_as_failed_with_what_happened_next(slurm_cluster, shim,
                                                                                       tmp_path):
    shim.rule("scontrol", range(1, 1000), TIMEOUT, arg="requeue")
    run_dir, ckpt, job_id = start(tmp_path)
    nodes = job_field(slurm_cluster, job_id, "NodeList")
    slurm_cluster.run(["sbatch", "--partition=high", f"--nodelist={nodes}", "--nodes=1",
                       f"--ntasks-per-node={slurm_cluster.layout.cpus_per_node}", "--cpus-per-task=1",
                       "--job-name=hpc-preemptor", "--output=/dev/null", "--wrap=true"])
    wait_for(lambda: events(ckpt) and "next" in events(ckpt)[-1], "the record of what followed the failed requeue",
             timeout=120)
    shim.clear()
    [event] = events(ckpt)
    assert (event["kind"], event["requeue"], event["by"]) == ("preempt", False, None), event
    assert event["slurm"].startswith("not requeued: scontrol requeue exited 1") and "Socket timed out" in event["slurm"]
    assert "Socket timed out" in event["why"] and "HINT:" in event["why"]
    assert requeues(shim) >= 3  # asked again within the grace time, after srun's end too
    fallback = re.search(r"job (\d+) submits the task again into the run directory", event["next"])
    assert fallback, event  # what the wrapper did next: the fallback resubmission, named
    wait_for(lambda: job_field(slurm_cluster, job_id, "JobState") == "FAILED", "the job to end unrequeued")
    assert job_field(slurm_cluster, job_id, "Restarts") == "0"
    wait_for(lambda: finished(ckpt), "the resubmitted task to finish from where it stopped", timeout=240)
    jobs = [j["job_id"] for j in RunDir(run_dir).tasks()[0]["jobs"]]
    assert len(jobs) == 2 and jobs[0] == job_id, jobs  # submitted again once, by the fallback


def test_a_job_survives_a_slurmctld_restart_and_a_preemption_after_it_is_requeued(slurm_cluster, tmp_path):
    _, ckpt, job_id = start(tmp_path)
    ctld = next(d for d in slurm_cluster._daemons() if d.name == "slurmctld")
    assert ctld.stop()  # SIGTERM: slurmctld saves its state and leaves; the job's steps run on
    before = steps_of(ckpt, 0)
    ctld.start(slurm_cluster._daemon_env())  # the same command line, the same state directory
    wait_for(lambda: steps_of(ckpt, 0) >= before + 3, "the job stepping on after the restart")
    assert job_field(slurm_cluster, job_id, "JobState") == "RUNNING"
    preempt(slurm_cluster, job_id, release=False)
    release(slurm_cluster, job_id)
    wait_for(lambda: job_field(slurm_cluster, job_id, "JobState") == "COMPLETED", "the rerun to finish")
    assert finished(ckpt)
    [event] = events(ckpt)
    assert (event["kind"], event["requeue"]) == ("preempt", True), event
