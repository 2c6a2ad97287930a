"""The `run` pipeline's unmodified script at its time limit on the real local cluster: the
pre-timeout signal, then a requeue per max_timeouts.

    python -m pytest tests/slurm/test_run_time_limit.py -m slurm
"""

from __future__ import annotations

import json
import subprocess

import pytest

from hpc.cluster.preempt import job_field
from tests.slurm.requeue_helpers import SIGNAL_SCRIPT, release, steps_of, submit_run, wait_for

pytestmark = pytest.mark.slurm


def test_run_script_survives_the_time_limit_signal_and_is_requeued_per_max_timeouts(slurm_cluster, tmp_path):
    """--signal=USR2@40 with a 1-minute limit: rank 1, which does not handle USR2, keeps running
    after it; rank 0 gets it in its handler. At the limit the job is requeued once (max_timeouts=1),
    and the second time it is not."""
    script = tmp_path / "signal_script.py"
    script.write_text(SIGNAL_SCRIPT)
    run_dir = tmp_path / "run"
    job_id = submit_run(run_dir, script, "stages.main.time_min=1", "stages.main.signal_delay_s=40",
                        "stages.main.max_timeouts=1")
    ckpt = run_dir / "main" / "checkpoints"
    for restart in (0, 1):
        got = ckpt / f"usr2-restart{restart}"
        wait_for(got.exists, f"rank 0's USR2 handler in attempt {restart}", timeout=240)
        at_signal = steps_of(ckpt, 1)
        wait_for(lambda: steps_of(ckpt, 1) >= at_signal + 3, "rank 1 stepping on after USR2", timeout=30)
        if restart == 0:
            wait_for(lambda: int(job_field(slurm_cluster, job_id, "Restarts") or 0) == 1,
                     "the requeue at the time limit", timeout=240)
            release(slurm_cluster, job_id)
    # The second decision is recorded when the signal comes; the job would then run on to its time
    # limit, which only costs the test time: end it once the decision is on disk.
    def decisions() -> list:
        try:
            return json.loads((ckpt / "requeue.json").read_text())["events"]
        except (FileNotFoundError, ValueError, KeyError):
            return []
    wait_for(lambda: len(decisions()) == 2, "the second decision", timeout=240)
    subprocess.run(["scancel", job_id], check=True)
    wait_for(lambda: job_field(slurm_cluster, job_id, "JobState") not in {"RUNNING", "COMPLETING", "PENDING"},
             "the job to end", timeout=120)
    history = json.loads((ckpt / "requeue.json").read_text())
    assert [(e["kind"], e["requeue"]) for e in history["events"]] == [("timeout", True), ("timeout", False)]
    assert "max_timeouts=1" in history["events"][1]["why"]
    assert job_field(slurm_cluster, job_id, "Restarts") == "1"
