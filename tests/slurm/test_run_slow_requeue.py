"""The `run` pipeline's unmodified script preempted on the real local cluster while rank 0's requeue
is slow: the other ranks wait for rank 0's decision.

    python -m pytest tests/slurm/test_run_slow_requeue.py -m slurm
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from hpc.cluster.preempt import job_field
from tests.slurm.requeue_helpers import SIGNAL_SCRIPT, release, steps_of, submit_run, wait_for

pytestmark = pytest.mark.slurm


SLOW_REQUEUE = """\
#!/bin/sh
# scontrol whose requeue answers after 15 s, three times the longest fixed wait of the other ranks
# (5 s for their own copy of the signal, jobs.run._await_own_signal)
[ "$1" = requeue ] && sleep 15
exec {real} "$@"
"""


def test_run_ranks_wait_for_rank_0s_slow_requeue(slurm_cluster, tmp_path, monkeypatch):
    """Every task gets SIGTERM and its script dies; rank 0's requeue takes 15 s. Rank 1 must not
    leave first: with --kill-on-bad-exit its early exit would end rank 0 before the requeue."""
    import shutil

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text(SLOW_REQUEUE.format(real=shutil.which("scontrol")))
    (fake / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")  # sbatch exports it to the job
    script = tmp_path / "count.py"
    script.write_text(SIGNAL_SCRIPT.replace("100000", "60").replace("sleep(0.5)", "sleep(0.1)"))
    run_dir = tmp_path / "run"
    job_id = submit_run(run_dir, script)
    ckpt = run_dir / "main" / "checkpoints"
    wait_for(lambda: steps_of(ckpt, 0) >= 2 and steps_of(ckpt, 1) >= 2, "both ranks stepping")
    subprocess.run(["scancel", "--signal=TERM", job_id], check=True)
    wait_for(lambda: int(job_field(slurm_cluster, job_id, "Restarts") or 0) == 1, "the slow requeue",
             timeout=120)
    release(slurm_cluster, job_id)
    wait_for(lambda: job_field(slurm_cluster, job_id, "JobState") == "COMPLETED", "the rerun to finish")
    assert steps_of(ckpt, 0) == steps_of(ckpt, 1) == 60
    history = json.loads((ckpt / "requeue.json").read_text())
    assert [(e["kind"], e["requeue"], e["by"]) for e in history["events"]] == [("preempt", True, "hpc")]
