"""Waiting on jobs of the local cluster, and the `run` pipeline's signal script, for the SLURM tests
of preemption, time limits and requeues."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from hpc.cluster.preempt import job_field


def wait_for(cond, what: str, timeout: float = 240):
    """Poll `cond` every 0.2 s for its first 2 s, then every 0.5 s: most conditions ask the
    scheduler (a client process and a controller RPC each), and four workers' tests poll at once."""
    start = time.monotonic()
    deadline = start + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2 if time.monotonic() - start < 2 else 0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def release(cluster, job_id: str) -> None:
    """A requeued job waits ~2 min (Reason=BeginTime); let it start now.

    The update only sticks once the job is PENDING again (not while it is still COMPLETING), so
    repeat it until SLURM no longer holds the job for its begin time, and make it at least once:
    right after the requeue SLURM may not show Reason=BeginTime yet, and the hold comes all the
    same (a job then waited the whole two minutes). Wait 2 s first: a job restarted within the
    second of its requeue is refused by slurmd ("Job credential revoked", credential times have
    one-second resolution) and ends FAILED.
    """
    time.sleep(2)
    updated = []

    def started() -> bool:
        state = job_field(cluster, job_id, "JobState")
        if state != "PENDING":
            return state == "RUNNING"  # preempt() returned after the requeue: this is the rerun
        if updated and job_field(cluster, job_id, "Reason") != "BeginTime":
            return True
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], capture_output=True)
        updated.append(time.monotonic())
        return False
    wait_for(started, f"job {job_id} pending without the begin-time hold", timeout=120)


# The `run` pipeline: an unmodified script, rank 0 of which handles the pre-timeout signal while
# rank 1 does not. Each rank counts steps in HPC_CHECKPOINT_DIR and resumes from its count.
SIGNAL_SCRIPT = """\
import os, pathlib, signal, time
ckpt = pathlib.Path(os.environ["HPC_CHECKPOINT_DIR"])
rank, restart = os.environ["RANK"], os.environ.get("SLURM_RESTART_COUNT", "0")
if rank == "0":
    signal.signal(signal.SIGUSR2, lambda *a: (ckpt / f"usr2-restart{restart}").write_text(str(time.time())))
count = ckpt / f"steps-rank{rank}"
step = int(count.read_text()) if count.exists() else 0
while step < 100000:
    time.sleep(0.5)
    step += 1
    (ckpt / "tmp").mkdir(exist_ok=True)
    tmp = ckpt / "tmp" / count.name; tmp.write_text(str(step)); os.replace(tmp, count)
"""


def submit_run(run_dir: Path, script: Path, *overrides: str) -> str:
    from hpc import submit
    from hpc.rundir.run import RunDir

    assert submit.main(["run", "--cluster", "slurm", "--run-dir", str(run_dir), "--nodes", "1",
                        "--gpus-per-node", "2", "stages.main.cpus_per_task=1",
                        "stages.main.partition=low", *overrides, "--", sys.executable, str(script)]) == 0
    return RunDir(run_dir).tasks()[0]["job_id"]


def steps_of(ckpt: Path, rank: int) -> int:
    try:
        return int((ckpt / f"steps-rank{rank}").read_text())
    except (FileNotFoundError, ValueError):
        return 0


def events(ckpt: Path) -> list:
    """The stop record's events (checkpoints/requeue.json), [] until it exists and reads whole."""
    try:
        return json.loads((ckpt / "requeue.json").read_text())["events"]
    except (FileNotFoundError, ValueError, KeyError):
        return []
