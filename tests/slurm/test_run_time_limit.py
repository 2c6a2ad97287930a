"""The `run` pipeline's wrapper decides within SLURM's time whatever the script does: a script that
ignores SIGTERM and the time-limit warning is requeued at its time limit and again when preempted,
each time before SLURM would end the job.

    python -m pytest tests/slurm/test_run_time_limit.py -m slurm
"""

from __future__ import annotations

import subprocess

import pytest

from hpc.cluster.preempt import job_field, preempt
from hpc.recovery.deadline import end_time
from tests.slurm.requeue_helpers import events, release, steps_of, submit_run, wait_for

pytestmark = pytest.mark.slurm

# Every rank notes the stop signals it gets and carries on sleeping: a script that never exits on
# its own (as one hung in its own SIGTERM handler would). Each rank counts its steps.
STUBBORN_SCRIPT = """\
import os, pathlib, signal, time
ckpt = pathlib.Path(os.environ["HPC_CHECKPOINT_DIR"])
rank, restart = os.environ["RANK"], os.environ.get("SLURM_RESTART_COUNT", "0")
def note(signum, frame):
    path = ckpt / f"{signal.Signals(signum).name}-rank{rank}-restart{restart}"
    path.write_text(str(time.time()))
for s in (signal.SIGTERM, signal.SIGUSR2):
    signal.signal(s, note)
count = ckpt / f"steps-rank{rank}"
step = int(count.read_text()) if count.exists() else 0
while True:
    time.sleep(0.5)
    step += 1
    (ckpt / "tmp").mkdir(exist_ok=True)
    tmp = ckpt / "tmp" / count.name; tmp.write_text(str(step)); os.replace(tmp, count)
"""


def test_a_script_that_ignores_stop_signals_is_requeued_in_time_at_a_limit_and_a_preemption(slurm_cluster,
                                                                                             tmp_path):
    """2-minute limit, warning 60 s before it (USR2 to the step, passed on to the script as SIGTERM,
    which it ignores): rank 0's wrapper decides before the limit, and the job is requeued (timeout).
    SLURM sends the warning at its first look once the limit is within 90 s, so 30 s or more after the
    start, when the step is running (a warning due at the start can come before the step exists and
    reach no one: hpc.pipeline.earlysignal).
    Then preempted (SIGTERM, GraceTime 10 s, also ignored): requeued again, within the grace time."""
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN_SCRIPT)
    run_dir = tmp_path / "run"
    job_id = submit_run(run_dir, script, "stages.main.time_min=2", "stages.main.signal_delay_s=60",
                        "stages.main.max_timeouts=1")
    ckpt = run_dir / "main" / "checkpoints"
    wait_for(lambda: (ckpt / "SIGUSR2-rank0-restart0").exists(), "the time-limit warning", timeout=240)
    # the warning reaches the script twice: SLURM's USR2, and the wrapper's SIGTERM passed on
    wait_for(lambda: (ckpt / "SIGTERM-rank1-restart0").exists(), "the warning passed on as SIGTERM", timeout=30)
    limit = end_time({"EndTime": job_field(slurm_cluster, job_id, "EndTime")})  # SLURM sends the warning
    assert limit is not None  # up to a minute early, so the limit itself is the reference
    wait_for(lambda: len(events(ckpt)) == 1, "the decision at the time limit", timeout=120)
    first = events(ckpt)[0]
    assert (first["kind"], first["requeue"]) == ("timeout", True)
    assert first["time"] < limit  # before the limit, not at SLURM's kill after it
    wait_for(lambda: int(job_field(slurm_cluster, job_id, "Restarts") or 0) == 1, "the requeue", timeout=120)
    release(slurm_cluster, job_id)

    wait_for(lambda: job_field(slurm_cluster, job_id, "JobState") == "RUNNING", "the second attempt", timeout=120)
    at_start = steps_of(ckpt, 0)
    wait_for(lambda: steps_of(ckpt, 0) >= at_start + 2, "the second attempt stepping", timeout=60)
    preempt(slurm_cluster, job_id, release=False)
    wait_for(lambda: len(events(ckpt)) == 2, "the decision after the preemption", timeout=120)
    second = events(ckpt)[1]
    termed = float((ckpt / "SIGTERM-rank0-restart1").read_text())
    assert (second["kind"], second["requeue"]) == ("preempt", True)
    assert second["time"] - termed < slurm_cluster.layout.grace_time_s
    wait_for(lambda: int(job_field(slurm_cluster, job_id, "Restarts") or 0) == 2, "the second requeue", timeout=120)
    subprocess.run(["scancel", job_id], check=True)
