"""A controller that does not answer a stop's requeue: jobs preempted while `scontrol requeue` times out.

    python -c "from faults.controller import requeue_timeouts as f; print(f(__import__('pathlib').Path('/tmp/x'), 2, 0))"

Each fault is tests/slurm/test_requeue_faults.py's first test on a local SLURM cluster (hpc.cluster):
the `run` pipeline's counting script on 2 ranks (tests/slurm/requeue_helpers.py), submitted with
`python -m hpc.submit` with the real SLURM clients wrapped by faults.slurmshim first on PATH (sbatch
passes it on to the job), which answer the job's next 1 or 2 `scontrol requeue` calls (drawn from the
seed) with "Socket timed out on send/recv operation"; then a real preemption (hpc.cluster.preempt).
hpc's srun wrapper must ask again within the grace time and requeue the job, which resumes from its
step count and completes.

Counted as lost: a job not COMPLETED with every step of both ranks done; submitted twice: a task with
more than one job in the run's manifest (the fallback resubmission), or more than the one sbatch
call of the submission; rerun after completing: a job restarted more than the once its preemption
asks for. The cluster is faults.nodes.campaign_cluster.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

from faults.common import Outcome
from faults.exits import ENDED
from faults.nodes import campaign_cluster, wait_for
from faults.slurmshim import TIMEOUT, SlurmShim
from hpc.cluster import LocalCluster
from hpc.cluster.daemons import ClusterError
from hpc.cluster.preempt import job_field, preempt
from hpc.rundir.run import RunDir
from tests.slurm.requeue_helpers import SIGNAL_SCRIPT, steps_of

REPO = Path(__file__).resolve().parents[1]
STEPS = 60  # of 0.2 s each: about 12 s of work uninterrupted
SCRIPT = SIGNAL_SCRIPT.replace("100000", str(STEPS)).replace("sleep(0.5)", "sleep(0.2)")
START_S, FINISH_S = 120.0, 180.0


def requeue_timeouts(scratch: Path, count: int, seed: int) -> Outcome:
    """Preempt `count` jobs in turn, each while its first requeue calls time out; count what went wrong."""
    rng = random.Random(seed)
    scratch.mkdir(parents=True, exist_ok=True)
    outcome = Outcome(0, 0, f"{count} `run` jobs of 2 ranks ({STEPS} steps), each preempted while its next 1 or 2 "
                            "`scontrol requeue` calls time out (faults.slurmshim); each requeued by hpc within "
                            "the grace time, COMPLETED with every step once, submitted once, restarted once")
    with campaign_cluster(scratch) as cluster:
        for i in range(count):
            cluster.settle()
            outcome.add(_fault(cluster, scratch / f"fault-{i}", rng.choice([1, 2])))
    lost = outcome.lost
    outcome.detail += f"; jobs lost, submitted twice or rerun after completing: {lost}"
    return outcome


def _fault(cluster: LocalCluster, root: Path, timeouts: int) -> str:
    """One preemption whose first `timeouts` requeue calls time out: '' when the job ended as it should."""
    shim = SlurmShim(root / "shim")
    shim.rule("scontrol", range(1, timeouts + 1), TIMEOUT, arg="requeue")
    script, run_dir = root / "count.py", root / "run"
    script.write_text(SCRIPT)
    subprocess.run([sys.executable, "-m", "hpc.submit", "run", "--cluster", "slurm", "--run-dir", str(run_dir),
                    "--nodes", "1", "--gpus-per-node", "2", "stages.main.cpus_per_task=1",
                    "stages.main.partition=low", "--", sys.executable, str(script)],
                   cwd=REPO, env=shim.env(cluster.client_env()), check=True, capture_output=True, text=True)
    ckpt, job = run_dir / "main" / "checkpoints", RunDir(run_dir).tasks()[0]["job_id"]
    try:
        wait_for(lambda: min(steps_of(ckpt, 0), steps_of(ckpt, 1)) >= 3, START_S, f"job {job} stepping")
        preempt(cluster, job, release=True)
        wait_for(lambda: job_field(cluster, job, "JobState") in ENDED, FINISH_S, f"job {job} to end")
        return _judge(cluster, job, run_dir, ckpt, shim, timeouts)
    except (TimeoutError, ClusterError, OSError) as err:
        return f"{timeouts} requeue timeout(s), job {job}: {err}"
    finally:
        cluster.run(["scancel", job], check=False)
        time.sleep(1)


def _judge(cluster: LocalCluster, job: str, run_dir: Path, ckpt: Path, shim: SlurmShim, timeouts: int) -> str:
    state, restarts = job_field(cluster, job, "JobState"), job_field(cluster, job, "Restarts")
    if state != "COMPLETED" or (steps_of(ckpt, 0), steps_of(ckpt, 1)) != (STEPS, STEPS):
        return f"job {job} lost: {state}, steps {steps_of(ckpt, 0)} and {steps_of(ckpt, 1)} of {STEPS}"
    jobs = [j["job_id"] for t in RunDir(run_dir).tasks() for j in t["jobs"]]
    if len(jobs) != 1 or len(shim.calls("sbatch")) != 1:
        return f"job {job} submitted twice: manifest jobs {jobs}, {len(shim.calls('sbatch'))} sbatch calls"
    if restarts != "1":
        return f"job {job} restarted {restarts} times for one preemption"
    asked = sum(call[1:2] == ["requeue"] for call in shim.calls("scontrol"))
    return "" if asked == timeouts + 1 else f"job {job}: {asked} requeue calls for {timeouts} timeout(s)"
