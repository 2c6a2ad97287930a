"""Nodes checked before training, on the real local cluster: a node that fails its check is excluded before
any rank starts, and one that fails twice in a run is avoided by the run's later jobs without a check.

    python -m pytest tests/slurm/test_nodecheck.py -m slurm

The failure is the site's: stages.X.node_check.command fails on the last node by SLURMD_NODENAME, as a
site's health script does on a node with a bad GPU, or a node's GPU device file is gone. Each stage asks
for 1-2 nodes, so the job starts on both, and the requeue without the bad node runs on the other.
"""
import json
import time
from pathlib import Path

import pytest

from hpc import submit
from hpc.cluster.preempt import job_field, release_hold
from hpc.recovery import nodecheckrecord
from hpc.rundir.run import DONE, RunDir
from tests.slurm.test_pipeline import ended, job_ids, wait_until
from tests.slurm.pipelines import use_pipelines

pytestmark = pytest.mark.slurm


pipelines = use_pipelines(elastic="tests.elastic_pipeline", tiny="tests.tiny_pipeline")


def fails_on(node):
    command = f'[ "$SLURMD_NODENAME" != {node} ] || (echo GPU 0 has fallen off the bus; exit 3)'
    return f"stages.{{}}.node_check.command='{command}'"


def releasing(cluster, run, done, timeout_s, what):
    """Wait for done(), starting each job the check requeued at once (not after SLURM's 2-minute hold)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done():
            return
        for job in set(job_ids(run).values()):
            if job_field(cluster, job, "JobState") == "PENDING" and job_field(cluster, job, "Reason") == "BeginTime":
                release_hold(cluster, job, time.monotonic() + 30)
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def checks(run):
    return nodecheckrecord.records(run.path)


def test_a_node_that_fails_its_check_is_excluded_before_the_first_training_step(slurm_cluster, tmp_path):
    bad, good = slurm_cluster.nodes[-1], slurm_cluster.nodes[0]
    assert submit.main(["elastic", "--cluster", "slurm", "--run-dir", str(tmp_path / "run"), "stages.train.nodes=1-2",
                        "elastic.steps=2", fails_on(bad).format("train"),
                        "stages.train.node_check.collective=true"]) == 0
    run = RunDir(tmp_path / "run")
    out, job = run.task_dir("train"), job_ids(run)[("train", None)]
    releasing(slurm_cluster, run, lambda: (out / DONE).is_file(), 240, "training to finish")
    first, second = checks(run)
    assert (first["job"], first["restart"], first["nodes"]) == (job, "0", [good, bad])
    assert first["failed"] == {bad: "site check exited 3: GPU 0 has fallen off the bus"}, first
    assert first["note"] == "the collective passed on 2 node(s)", first  # the bad node joined it all the same
    assert first["done"].startswith("requeued") and bad in first["done"]
    assert (second["restart"], second["nodes"], second["failed"]) == ("1", [good], {})
    # no rank ever started on the bad node: the one attempt that trained is the requeued one, on one node
    attempts = [json.loads(line) for line in (out / "attempts.jsonl").read_text().splitlines()]
    assert [(a["tag"], a["nodes"], a["resumed_from"]) for a in attempts] == [(f"{job}-1-", 1, 0)]
    assert not list(out.glob(f"**/ids-{job}-0-*"))
    assert bad in job_field(slurm_cluster, job, "ExcNodeList")
    records = wait_until(lambda: (r := ended(run)) and r[job].restarts == 1 and r, 60, "its end in sacct")
    assert records[job].state == "COMPLETED" and bad not in records[job].nodes, records[job]


def test_a_node_that_fails_twice_in_a_run_is_avoided_without_a_check_on_the_requeue(slurm_cluster, tmp_path):
    bad, good = slurm_cluster.nodes[-1], slurm_cluster.nodes[0]
    stages = ("first", "second", "third")
    options = [f"stages.{s}.{key}" for s in stages
               for key in ("nodes=1-2", "tasks_per_node=2", "node_check.avoid_after=2")]
    assert submit.main(["tiny", "--cluster", "slurm", "--run-dir", str(tmp_path / "run"), "tiny.parts=[0]",
                        "tiny.third=true", *options, *[fails_on(bad).format(s) for s in stages]]) == 0
    run = RunDir(tmp_path / "run")
    releasing(slurm_cluster, run, lambda: ended(run), 360, "the three stages to end")
    ids = job_ids(run)
    by_job = {}
    for check in checks(run):
        by_job.setdefault(check["job"], []).append(check)
    first, second, third = (by_job[ids[key]] for key in (("first", None), ("second", 0), ("third", None)))
    # the first two jobs check the bad node and fail it; from then on the run avoids it
    for job in (first, second):
        assert [c["failed"] for c in job] == [{bad: "site check exited 3: GPU 0 has fallen off the bus"}, {}], job
    assert third[0]["failed"][bad].startswith(nodecheckrecord.AVOIDED), third
    assert list(third[0]["wall_cpu_s"]) == [good]  # only the other node ran the check
    assert third[0]["done"].startswith("requeued") and bad in third[0]["done"]
    assert nodecheckrecord.avoided(run.path, 2) == [bad]
    records = ended(run)
    assert all(r.state == "COMPLETED" and bad not in r.nodes for r in records.values()), records


@pytest.fixture
def gpu_files_gone(slurm_cluster):
    """The last node's fake GPU device files moved away (as a GPU lost by the driver), put back after the test."""
    node = slurm_cluster.nodes[-1]
    files = sorted((Path(slurm_cluster.dir) / "dev").glob(f"{node}-gpu*"))
    assert files, "the cluster has no fake GPU files"
    for path in files:
        path.rename(path.with_name(path.name + ".gone"))
    try:
        yield node, files
    finally:
        for path in files:
            path.with_name(path.name + ".gone").rename(path)


def test_a_node_whose_gpu_device_file_is_gone_is_excluded_by_the_builtin_check(slurm_cluster, gpu_files_gone, tmp_path):
    bad, files = gpu_files_gone
    assert submit.main(["tiny", "--cluster", "slurm", "--run-dir", str(tmp_path / "run"), "tiny.parts=[0]",
                        "stages.first.nodes=1-2", "stages.first.tasks_per_node=2", "stages.first.gpus_per_node=1",
                        "stages.first.node_check.enabled=true"]) == 0
    run = RunDir(tmp_path / "run")
    releasing(slurm_cluster, run, lambda: ended(run), 240, "the two stages to end")
    first, second = checks(run)  # only the stage that asked for it is checked
    assert list(first["failed"]) == [bad] and first["failed"][bad].startswith(f"GPU device file {files[0]}"), first
    assert second["failed"] == {} and bad not in second["nodes"]
    job = job_ids(run)[("first", None)]
    assert all(r.state == "COMPLETED" for r in ended(run).values()) and bad in job_field(slurm_cluster, job,
                                                                                          "ExcNodeList")


def test_a_node_that_fails_its_check_is_replaced_by_a_spare_without_a_requeue(slurm_cluster, tmp_path):
    """The job holds one node more than it trains on (spare_nodes): the node that fails its check is
    left out and the ranks start on the healthy one, in the same job. The failing node is the job's
    last, the one a step on "the nodes less the spares" would take (the first, which runs the batch
    script, is the spare)."""
    import subprocess

    good, bad = slurm_cluster.nodes[0], slurm_cluster.nodes[1]
    assert submit.main(["elastic", "--cluster", "slurm", "--run-dir", str(tmp_path / "run"), "stages.train.nodes=1",
                        "stages.train.spare_nodes=1", "elastic.steps=2", fails_on(bad).format("train")]) == 0
    run = RunDir(tmp_path / "run")
    out, job = run.task_dir("train"), job_ids(run)[("train", None)]
    releasing(slurm_cluster, run, lambda: (out / DONE).is_file(), 240, "training to finish")
    (check,) = checks(run)
    assert (check["job"], check["restart"], check["failed"]) == (job, "0", {bad: "site check exited 3: GPU 0 has "
                                                                           "fallen off the bus"}), check
    assert check["done"].startswith("left out"), check
    attempts = [json.loads(line) for line in (out / "attempts.jsonl").read_text().splitlines()]
    assert [(a["tag"], a["nodes"], a["resumed_from"]) for a in attempts] == [(f"{job}-0-", 1, 0)]
    records = wait_until(lambda: (r := ended(run)) and r, 60, "its end in sacct")
    assert (records[job].state, records[job].restarts) == ("COMPLETED", 0), records[job]
    steps = subprocess.run(["sacct", "-j", job, "-n", "-P", "-o", "JobID,JobName,NodeList"], capture_output=True,
                           text=True, check=True).stdout.split()
    trained = [s.split("|")[2] for s in steps if s.startswith(f"{job}.") and "nodecheck" not in s
               and not s.split("|")[0].endswith(("batch", "extern"))]
    assert trained == [good], steps  # no rank on the bad node
