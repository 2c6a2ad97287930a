"""The local cluster of a campaign, and a node of it that fails under a job and comes back: what
tests/slurm/test_node_failure.py and the node-failure campaign (faults.nodefail) play.

    from faults.nodes import bring_back, fail_node
    fail_node(cluster, "n2", job_id); ...; bring_back(cluster, "n2")

A campaign's cluster (campaign_cluster) is started in its scratch directory and stopped at the end,
unless HPC_FAULTS_CLUSTER_DIR names one that is already up, which is used and left up (not for a
campaign that needs a site variant: limits enforced, ended jobs forgotten sooner).

A failure is played as a node dies: its slurmd is killed, then the job's processes on it (a node that
dies takes them along), then SLURM is told that the node is DOWN, as slurmctld says itself once
SlurmdTimeout (300 s on the local cluster) has passed. Bringing it back starts slurmd again and
resumes the node, so that afterwards only an exclusion keeps a job off it.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from hpc.cluster import LocalCluster
from hpc.cluster.preempt import job_field

REASON = "hpc-node-failure-test"
OUT_OF_SERVICE = frozenset({"DOWN", "DRAIN", "NOT_RESPONDING"})


@contextmanager
def campaign_cluster(scratch: Path, **variant: Any) -> Iterator[LocalCluster]:
    """A local cluster up for the campaign's duration (see the module docstring); one given a
    `variant` (LocalCluster's keywords: min_job_age_s=5, limits=True) is always the campaign's own."""
    given = None if variant else os.environ.get("HPC_FAULTS_CLUSTER_DIR")
    cluster = LocalCluster(given or Path(scratch) / "cluster", **variant)
    owned = not cluster.is_up()
    if owned:
        cluster.up(log=lambda msg: None)
    try:
        yield cluster
    finally:
        if owned:
            cluster.down(log=lambda msg: None)


def wait_for(pred: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.5) -> Any:
    """The first true value of `pred()`, polled until `timeout_s`; TimeoutError naming `what` after."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(poll_s)


def node_state(cluster: LocalCluster, node: str) -> str:
    """The node's State= of `scontrol show node` (BASE+FLAG+...)."""
    out = cluster.run(["scontrol", "show", "node", node]).stdout
    return next(w.split("=", 1)[1] for w in out.split() if w.startswith("State="))


def in_service(cluster: LocalCluster, node: str) -> bool:
    return not OUT_OF_SERVICE & set(node_state(cluster, node).split("+"))


def bring_back(cluster: LocalCluster, node: str, timeout_s: float = 60) -> None:
    """slurmd started again (`up` starts what is missing) and the node in service."""
    cluster.up(log=lambda msg: None)
    cluster.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)  # may be back already
    wait_for(lambda: in_service(cluster, node), timeout_s, f"{node} back in service")


def job_processes(job_id: str, node: str) -> set[int]:
    """Pids of the job's tasks on `node`, with the slurmstepd above them (their environment says so)."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            env = set((entry / "environ").read_bytes().split(b"\0"))
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if {f"SLURM_JOB_ID={job_id}".encode(), f"SLURMD_NODENAME={node}".encode()} <= env:
            found.add(int(entry.name))
            try:
                if b"slurmstepd" in Path(f"/proc/{parent}/cmdline").read_bytes():
                    found.add(parent)
            except OSError:
                continue  # the parent has just exited
    return found


def fail_node(cluster: LocalCluster, node: str, job_id: str) -> None:
    """The node dies under the job: its slurmd and the job's processes there, then SLURM marks it DOWN."""
    own_id = job_field(cluster, job_id, "JobId")  # an array task's processes see its own job id, not 12_0
    os.kill(int(cluster.layout.path("run", f"slurmd-{node}.pid").read_text()), signal.SIGKILL)
    for pid in job_processes(own_id, node):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # ended on its own meanwhile
    cluster.run(["scontrol", "update", f"nodename={node}", "state=down", f"reason={REASON}"])
