"""Preemption, time-limit signals and resume on the real local cluster, through submitit (the
`run` pipeline's signals are test_run_time_limit.py's and test_run_slow_requeue.py's).

    python -m pytest tests/slurm/test_preemption.py -m slurm

The reference run goes first: a preemptor takes every CPU of the victim's nodes, and would
preempt any other `low` job running there too.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import cloudpickle
import pytest
import submitit
import torch

import tests.preemption_workload as workload
from hpc.cluster.preempt import job_field, preempt
from tests.slurm.requeue_helpers import release, wait_for

pytestmark = pytest.mark.slurm
TOTAL = 70  # steps of 0.15 s: about 10 s of training per uninterrupted run
# The workload module is not importable inside the job; ship its code in the pickle.
cloudpickle.register_pickle_by_value(workload)


def executor(folder: Path, nodes: int = 2, tasks: int = 2) -> submitit.AutoExecutor:
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
    ex.update_parameters(slurm_partition="low", nodes=nodes, tasks_per_node=tasks, cpus_per_task=1,
                         timeout_min=10, slurm_signal_delay_s=30,
                         slurm_additional_parameters={"requeue": True})
    return ex


def progress(out: Path) -> dict:
    try:
        return json.loads((out / "progress.json").read_text())
    except (FileNotFoundError, ValueError):
        return {"step": 0, "restart": -1}


def attempts(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "attempts.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference_weights(slurm_cluster, tmp_path_factory) -> Path:
    """The uninterrupted run, without ballast: the ballast only adds state to the checkpoint, it
    changes no weight."""
    ref_dir = tmp_path_factory.mktemp("reference")
    ref = executor(ref_dir / "logs", nodes=1).submit(workload.train, str(ref_dir), total=TOTAL)
    assert [r["step"] for r in ref.results()] == [TOTAL] * 2
    return ref_dir / "weights.pt"


def test_preempted_twice_ends_bitwise_identical(slurm_cluster, reference_weights, tmp_path):
    """Both writers in one job: rank 0 has a small state, written by the store's writer thread; rank 1
    carries 64 MB more, with the fork threshold below it (preemption_workload), so each of its
    background saves forks a writer. One node of 2 ranks: a preemption of 2 x 2 ranks is
    test_elastic_cluster.py's, and the two ranks halve the CPU of the four runs this test makes."""
    cut_dir = tmp_path / "preempted"
    cut_dir.mkdir()

    job = executor(tmp_path / "cut-logs", nodes=1).submit(workload.train, str(cut_dir), total=TOTAL,
                                                          ballast_mb=64, ballast_every=2)
    # Early enough that the scheduler (sched_interval=1 s, and the grace time) preempts before the run ends.
    targets = sorted(random.Random().sample(range(3, 30), 2))
    for restart, target in enumerate(targets):
        wait_for(lambda: progress(cut_dir)["restart"] == restart and progress(cut_dir)["step"] >= target,
                 f"step {target} of attempt {restart}")
        preempt(slurm_cluster, job.job_id, release=False)
        release(slurm_cluster, job.job_id)
    results = job.results()  # submitit sees one job that finished, not three
    assert [r["step"] for r in results] == [TOTAL] * 2
    assert [r["ballast"] for r in sorted(results, key=lambda r: r["rank"])] == [False, True]
    runs = attempts(cut_dir)
    assert [a["restart"] for a in runs] == ["0", "1", "2"], runs
    assert runs[0]["resumed_from"] == 0 and all(a["resumed_from"] > 0 for a in runs[1:]), (targets, runs)
    history = json.loads((cut_dir / "checkpoints" / "requeue.json").read_text())
    assert history["preemptions"] == 2 and history["timeouts"] == 0
    a = torch.load(reference_weights, weights_only=True)
    b = torch.load(cut_dir / "weights.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), targets


def time_limit_signal(job_id: str) -> None:
    """What --signal=USR2@N delivers near the time limit: USR2 to every task of every step."""
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True)


def test_time_limit_signal_requeues_until_max_timeouts(slurm_cluster, tmp_path):
    """Job A gets the time-limit signal once and finishes; job B gets it twice with
    max_timeouts=1: the second time it is not requeued and its error says why."""
    dirs = {name: tmp_path / name for name in "AB"}
    jobs = {}
    for name, out in dirs.items():
        out.mkdir()
        # B only counts its timeouts: one rank does
        jobs[name] = executor(tmp_path / f"{name}-logs", nodes=1, tasks=2 if name == "A" else 1).submit(
            workload.train, str(out), total=TOTAL, step_s=0.1, max_timeouts=1)
    # Each gets the signal as soon as it is past step 5, while it trains: watched side by side, since
    # one may start long after the other on a busy machine and B, one rank, trains in about 7 s.
    waiting = dict(jobs)
    while waiting:
        wait_for(lambda: any(progress(dirs[n])["step"] >= 5 for n in waiting), f"job {sorted(waiting)} at step 5")
        for name in [n for n in waiting if progress(dirs[n])["step"] >= 5]:
            time_limit_signal(waiting.pop(name).job_id)
            assert progress(dirs[name])["step"] < TOTAL, f"job {name} ended before its signal: signalled too late"
    for name, job in jobs.items():
        wait_for(lambda: int(job_field(slurm_cluster, job.job_id, "Restarts") or 0) == 1,
                 f"job {name} requeued")
        release(slurm_cluster, job.job_id)
    wait_for(lambda: progress(dirs["B"])["restart"] == 1, "job B running again")
    time_limit_signal(jobs["B"].job_id)

    assert [r["step"] for r in jobs["A"].results()] == [TOTAL, TOTAL]
    assert [a["resumed_from"] for a in attempts(dirs["A"])][0] == 0
    assert attempts(dirs["A"])[1]["resumed_from"] >= 5
    history = json.loads((dirs["A"] / "checkpoints" / "requeue.json").read_text())
    assert (history["timeouts"], history["preemptions"]) == (1, 0)

    with pytest.raises(submitit.core.utils.FailedJobError) as err:
        jobs["B"].result()
    assert "not requeued" in str(err.value) and "max_timeouts=1" in str(err.value)
    assert len(attempts(dirs["B"])) == 2
    assert job_field(slurm_cluster, jobs["B"].job_id, "Restarts") == "1"
    # The checkpoint of the step it stopped at is there for a resubmission into the same directory.
    assert progress(dirs["B"])["step"] < TOTAL
    from hpc.checkpoint import CheckpointStore
    assert CheckpointStore(dirs["B"] / "checkpoints").latest() == progress(dirs["B"])["step"]


def test_sigkill_during_checkpoint_write_resumes_from_previous(slurm_cluster, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    job = executor(tmp_path / "logs", nodes=1).submit(workload.train, str(out), total=TOTAL,
                                                      step_s=0.1, ballast_mb=150)
    ckpt = out / "checkpoints"
    wait_for(lambda: (ckpt / "step-5").is_dir(), "the first checkpoint")
    partial = ckpt / ".step-10.tmp" / "shared.pt.part"
    deadline = time.monotonic() + 120
    while not partial.exists():  # a fine poll: the write lasts a fraction of a second
        assert time.monotonic() < deadline, "never saw the step-10 write in progress"
        time.sleep(0.002)
    # SIGKILL the ranks themselves (scancel --signal=KILL would cancel the job with SIGTERM first),
    # writers first: a forked checkpoint writer outlives its rank, and a real SIGKILL (OOM killer,
    # the end of GraceTime) takes every process of the job.
    for rank in (0, 1):
        pid = int((out / f"pid-{rank}").read_text())
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        for child in children:
            os.kill(int(child), signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: job_field(slurm_cluster, job.job_id, "JobState") in {"FAILED", "CANCELLED"},
             "the killed job to end")
    assert not (ckpt / "step-10").exists()
    subprocess.run(["scontrol", "requeue", job.job_id], check=True)
    release(slurm_cluster, job.job_id)
    assert [r["step"] for r in job.results()] == [TOTAL, TOTAL]
    assert [a["resumed_from"] for a in attempts(out)] == [0, 5]
    log = (tmp_path / "logs" / f"{job.job_id}_0_log.err").read_text()
    assert "skipping incomplete checkpoint" in log and ".step-10.tmp" in log
