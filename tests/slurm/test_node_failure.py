"""Node failures on the real local cluster: a node dies under a 1-2 node job, which resumes on the other.

    python -m pytest tests/slurm/test_node_failure.py -m slurm

The tests play the failure of the last node as faults.nodes does (its slurmd killed, then the job's
processes on it, then the node marked DOWN, as slurmctld does itself once SlurmdTimeout has passed).
The node is brought back (slurmd started again, the node resumed) before the job may start again, so
only the exclusion keeps the job off it; and after the test, whatever happens. The fault campaign
faults.nodefail repeats the first test's failure, many times.
"""
import json
import subprocess
import sys
import time

import pytest

from faults.nodes import bring_back, fail_node
from hpc.recovery import nodefail
from hpc import submit
from hpc.cluster.preempt import job_field, release_hold
from hpc.rundir.run import DONE, RunDir
from tests.box import boxed
from tests.slurm.test_pipeline import ended, job_ids, wait_until
from tests.slurm.pipelines import use_pipelines

pytestmark = pytest.mark.slurm
STEPS, HOLD_AT = 5, 3


pipelines = use_pipelines(elastic="tests.elastic_pipeline")


@pytest.fixture
def failing_node(slurm_cluster):
    node = slurm_cluster.nodes[-1]
    try:
        yield node
    finally:  # the next test must find every node in service
        bring_back(slurm_cluster, node)


def history(run, stage, item=None):
    return json.loads((run.task_dir(stage, item) / nodefail.HISTORY).read_text())


def status_text(run):
    return subprocess.run([sys.executable, "-m", "hpc.status", str(run.path)], capture_output=True, text=True,
                          check=True).stdout


def test_a_node_failure_requeues_the_job_without_the_node_from_its_checkpoint(slurm_cluster, failing_node, tmp_path):
    """Its ranks run with no SLURM client in reach (tests/box.py): the host's srun wrapper does all of it."""
    assert submit.main(["elastic", "--cluster", "slurm", "--run-dir", str(tmp_path / "run"), "stages.train.nodes=1-2",
                        f"elastic.steps={STEPS}", f"elastic.hold_at={HOLD_AT}", "elastic.hold_once=true",
                        *boxed()]) == 0
    run = RunDir(tmp_path / "run")
    out, job = run.task_dir("train"), job_ids(run)[("train", None)]
    assert " bwrap --die-with-parent " in (out / "logs" / job / f"{job}_submission.sh").read_text()
    wait_until(lambda: (out / "checkpoints" / f"step-{HOLD_AT - 1}" / "COMPLETE.json").is_file(), 180,
               f"the checkpoint of step {HOLD_AT - 1}")  # then every rank waits before step HOLD_AT
    assert job_field(slurm_cluster, job, "NumNodes") == "2"
    fail_node(slurm_cluster, failing_node, job)
    wait_until(lambda: failing_node in job_field(slurm_cluster, job, "ExcNodeList"), 60, "the node excluded")
    bring_back(slurm_cluster, failing_node)  # from here on, only the exclusion keeps the job off it
    release_hold(slurm_cluster, job, time.monotonic() + 30)
    wait_until(lambda: (out / DONE).is_file(), 120, "the requeued job to finish training")
    # sacct lists the attempt that ended NODE_FAIL before the requeued one: wait for the latter
    records = wait_until(lambda: (r := ended(run)) and r[job].restarts == 1 and r, 60, "its end in sacct")
    assert records[job].state == "COMPLETED", records[job]
    assert failing_node not in records[job].nodes, records[job]
    done = json.loads((out / DONE).read_text())
    assert (done["world_size"], done["nodes"]) == (2, 1)
    first, second = [json.loads(line) for line in (out / "attempts.jsonl").read_text().splitlines()]
    assert (first["world_size"], second["world_size"], second["resumed_from"]) == (4, 2, HOLD_AT - 1)
    seen = history(run, "train")
    assert (seen["node_failures"], seen["excluded"]) == (1, [failing_node]), seen
    text = status_text(run)
    assert f"node failures: 1 node failure(s), excluded: {failing_node}" in text, text
    assert f"requeued as job {job}" in text and f"ExcNodeList={failing_node}" in text, text


def test_where_requeue_is_refused_a_new_job_runs_the_task_without_the_node(slurm_cluster, failing_node, tmp_path):
    release = tmp_path / "release"
    run_dir = tmp_path / "run"
    # named by module path: the resubmission runs in a job of its own, where no alias is registered
    assert submit.main(["tests.tiny_pipeline", "--cluster", "slurm", "--run-dir", str(run_dir), "tiny.parts=[0]",
                        "tiny.third=true", "stages.second.nodes=1-2", "stages.second.tasks_per_node=2",
                        "tiny.slow_items=[0]", f"tiny.release_file={release}"]) == 0
    run = RunDir(run_dir)
    job = job_ids(run)[("second", 0)]
    wait_until(lambda: "item 0 working" in _text(run.log_path("second", job)), 60, "second[0] at work")
    assert job_field(slurm_cluster, job, "NumNodes") == "2"
    slurm_cluster.run(["scontrol", "update", f"jobid={job}", "requeue=0"])  # as a site that refuses requeue
    fail_node(slurm_cluster, failing_node, job)
    wait_until(lambda: (run.task_dir("second", 0) / nodefail.HISTORY).exists(), 60, "the failure recorded")
    bring_back(slurm_cluster, failing_node)
    release.touch()
    wait_until(lambda: job_ids(run)[("second", 0)] != job and ended(run), 120, "the new job and the stage after")
    records = ended(run)
    new = job_ids(run)[("second", 0)]
    assert records[new].state == "COMPLETED" and failing_node not in records[new].nodes, records[new]
    assert records[job_ids(run)[("third", None)]].state == "COMPLETED"  # it waited on the failed job
    assert "refused" in history(run, "second", 0)["events"][-1]["done"]
    assert f"exclude: {failing_node}" in (run.path / "config.yaml").read_text()


def _text(path):
    return path.read_text() if path.exists() else ""
