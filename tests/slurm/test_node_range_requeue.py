"""A preempted node-range job comes back on whatever the range allows: here, the one node left.

    python -m pytest tests/slurm/test_node_range_requeue.py -m slurm

Slurm 22.05 requeues a job with NumTasks pinned to its last allocation's: a 1-2 node job with 2 tasks
per node that ran on 2 nodes comes back asking for 4 tasks, so with a node drained it would pend for
good. Both ways a job is requeued are played: hpc requeues it (the `run` pipeline's wrapper, on the
preemption's SIGTERM, within GraceTime), and SLURM does (a script that lets GraceTime run out).
"""
import json
import time

import pytest

from hpc import submit
from hpc.cluster.preempt import job_field, preempt, release_hold
from hpc.rundir.run import DONE, RunDir
from faults.nodes import node_state
from tests.slurm.test_node_failure import pipelines  # noqa: F401 (fixture)
from tests.slurm.test_pipeline import job_ids, wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture
def drain(slurm_cluster):
    """drain(): take the last node out of service (it is put back after the test, whatever happens)."""
    node = slurm_cluster.nodes[-1]

    def take_out():
        slurm_cluster.run(["scontrol", "update", f"nodename={node}", "state=drain", "reason=hpc-node-range-test"])
        wait_until(lambda: "DRAIN" in node_state(slurm_cluster, node), 60, f"{node} drained")
        return node

    try:
        yield take_out
    finally:
        slurm_cluster.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
        wait_until(lambda: "DRAIN" not in node_state(slurm_cluster, node), 60, f"{node} back in service")


def submit_run(run_dir, script):
    """The `run` pipeline on 1-2 nodes x 2 tasks; every task runs `sh -c script`."""
    assert submit.main(["run", "--cluster", "slurm", "--run-dir", str(run_dir), "--nodes", "1-2",
                        "--gpus-per-node", "2", "--", "sh", "-c", script]) == 0
    return RunDir(run_dir)


# The script ends on SIGTERM, and rank 0's wrapper (hpc.scripts.runner) requeues the job with scontrol.
BY_HPC = "touch {ready}/$SLURM_PROCID; test -e {release} || exec sleep 600"
# The script outlives SIGTERM: SLURM requeues the job once GraceTime has run out, and hpc's code
# in the tasks never gets to act; only the batch script's wrapper of srun (hpc.afterstep) does.
BY_SLURM = "trap '' TERM; touch {ready}/$SLURM_PROCID; test -e {release} || sleep 600"


@pytest.mark.parametrize("script", [BY_HPC, BY_SLURM], ids=["requeued-by-hpc", "requeued-by-slurm"])
def test_a_requeued_node_range_job_restarts_on_the_node_left(slurm_cluster, drain, tmp_path, script):
    release, ready = tmp_path / "release", tmp_path / "ready"  # with release, the next attempt ends at once
    ready.mkdir()
    run, (stage, item) = submit_run(tmp_path / "run", script.format(release=release, ready=ready)), ("main", None)
    job = job_ids(run)[(stage, item)]
    wait_until(lambda: job_field(slurm_cluster, job, "JobState") == "RUNNING", 60, "the job running")
    assert job_field(slurm_cluster, job, "NumNodes") == "2"
    wait_until(lambda: len(list(ready.iterdir())) == 4, 60, "the script running on every rank")
    preempt(slurm_cluster, job, release=False)
    # the preemptor needs every node: it must have run before one is drained, or it waits ahead of the job
    wait_until(lambda: not slurm_cluster.run(["squeue", "-h", "-n", "hpc-preemptor"]).stdout.strip(), 60,
               "the preempting job to end")
    node = drain()
    release.touch()
    release_hold(slurm_cluster, job, time.monotonic() + 30)
    wait_until(lambda: run.is_done(stage, item), 60, "the requeued job to finish on the node left")
    done = json.loads((run.task_dir(stage, item) / DONE).read_text())
    assert (done["world_size"], done["nodes"]) == (2, 1)
    assert job_field(slurm_cluster, job, "Restarts") == "1" and node not in job_field(slurm_cluster, job, "NodeList")
