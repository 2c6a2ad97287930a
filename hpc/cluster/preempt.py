"""A real preemption on the local cluster, to rehearse a job's resume.

    python -m hpc.cluster preempt 42

Submits a job to the high-priority partition that needs every CPU of the victim's nodes, so the
scheduler (not us) preempts the victim: SIGTERM, GraceTime, requeue with the same job id. The
preemptor ends at once; the requeued victim is then released from SLURM's begin-time hold.
"""

from __future__ import annotations

import time

from hpc.cluster.daemons import ClusterError
from hpc.cluster.local import LocalCluster
from hpc.slurm import hostlist, scheduler

# Seconds between a requeue and releasing the job's hold (see release_hold).
REQUEUE_SETTLE_S = 2.0


def job_field(cluster: LocalCluster, job_id: str, key: str) -> str:
    try:
        return scheduler.job_info(job_id, cluster.client_env()).get(key, "")
    except RuntimeError as err:
        raise ClusterError(f"job {job_id} not found: {err}") from None


def preempt(cluster: LocalCluster, job_id: str | int, *, release: bool = True,
            timeout_s: float = 60.0) -> str:
    job_id = str(job_id)
    state = job_field(cluster, job_id, "JobState")
    if state != "RUNNING":
        raise ClusterError(f"job {job_id} is {state}, expected RUNNING. HINT: wait until squeue shows it running.")
    nodes = job_field(cluster, job_id, "NodeList")
    restarts = int(job_field(cluster, job_id, "Restarts") or 0)
    cpus = cluster.layout.cpus_per_node
    n_nodes = len(hostlist.expand(nodes))  # as `scontrol show hostnames` does, without a call
    cluster.run(["sbatch", "--partition=high", f"--nodelist={nodes}", f"--nodes={n_nodes}",
                 f"--ntasks-per-node={cpus}", "--cpus-per-task=1", "--job-name=hpc-preemptor",
                 "--output=/dev/null", "--wrap=true"])
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # A requeued job counts one more restart; it may already be pending again.
        if int(job_field(cluster, job_id, "Restarts") or 0) > restarts:
            break
        time.sleep(0.2)
    else:
        raise ClusterError(f"job {job_id} was not preempted within {timeout_s:.0f} s. HINT: is it in "
                           "partition `low`? Only `low` jobs are preemptible.")
    if release:
        release_hold(cluster, job_id, time.monotonic() + 30)
    return f"job {job_id} preempted on {nodes} and requeued (restart {restarts + 1})"


def release_hold(cluster: LocalCluster, job_id: str, deadline: float) -> None:
    """Start a requeued job now instead of after SLURM's ~2 minute begin-time hold.

    StartTime=now is ignored while the job is still COMPLETING, and a start within the same second
    as the requeue can fail with "Job credential revoked": wait for PENDING, then a little more.
    """
    while job_field(cluster, job_id, "JobState") != "PENDING":
        if time.monotonic() > deadline:
            return
        time.sleep(0.2)
    time.sleep(REQUEUE_SETTLE_S)
    updated = False  # right after a requeue SLURM may not show Reason=BeginTime yet: update once anyway
    while time.monotonic() < deadline:
        if updated and job_field(cluster, job_id, "Reason") != "BeginTime":
            return
        try:
            scheduler.start_now(job_id, cluster.client_env())
            updated = True
        except RuntimeError:
            pass  # still completing: the next round retries
        time.sleep(0.5)
