"""A job whose ranks cannot reach SLURM at all (the `exec` runtime under bubblewrap, every SLURM
client masked: tests/box.py) still lives through every stop: hpc's srun wrapper, on the host, carries
out what rank 0 decides (hpc.recovery.hostact), as it does for every job hpc submits. The box also
hides the host's hpc, submitit and the rest of hpc's pure-Python requirements: the ranks import them
from the copy hpc carries in (hpc.container.carry), as in an image with torch alone.

    CI=true python -m pytest tests/slurm/test_container_exec.py -q -p no:cacheprovider

Two jobs side by side, one per node (tests/container_pipeline.py): a 1 x 2 TrainLoop job, preempted
(requeued), then with a hung rank (ended by the watchdog, requeued), then finished, each attempt
from the checkpoint of the one before; and a one-task job without a TrainLoop at its time limit,
requeued once (max_timeouts=1) and ended at the second.
"""
import json
import os
from pathlib import Path

import pytest

from hpc import submit
from hpc.cluster.preempt import job_field, preempt
from hpc.container import carry
from hpc.recovery.hangs import HANGS, REPORT
from hpc.rundir.run import RunDir
from tests.box import boxed
from tests.slurm.requeue_helpers import release
from tests.slurm.test_pipeline import ended, wait_until
from tests.slurm.pipelines import use_pipelines

pytestmark = pytest.mark.slurm


box_pipeline = use_pipelines(box="tests.container_pipeline", boxlimit="tests.container_pipeline:LIMIT")


def restarts(cluster, job) -> int:
    return int(job_field(cluster, job, "Restarts") or 0)


def submit_boxed(name: str, run_dir: Path, *overrides: str) -> tuple:
    assert submit.main([name, "--cluster", "slurm", "--run-dir", str(run_dir), *boxed(), *overrides]) == 0
    run = RunDir(run_dir)
    ((job, stage),) = [(t["job_id"], t["stage"]) for t in run.tasks()]
    return run, job, run.task_dir(stage)


def test_jobs_without_slurm_in_reach_are_requeued_from_the_host(slurm_cluster, tmp_path):
    # restarts in place off: its hang is requeued (test_restart_in_place.py restarts one in place, boxed)
    run, job, out = submit_boxed("box", tmp_path / "box", "stages.train.max_restarts_in_place=0")
    limit_run, limit_job, limit_out = submit_boxed("boxlimit", tmp_path / "limit")

    wait_until(lambda: (out / "start-0-0.json").exists(), timeout_s=120, what="attempt 0 to train")
    preempt(slurm_cluster, job, release=False)
    release(slurm_cluster, job)
    wait_until(lambda: restarts(slurm_cluster, limit_job) == 1, timeout_s=150, what="the time limit's requeue")
    release(slurm_cluster, limit_job)
    wait_until(lambda: restarts(slurm_cluster, job) == 2, timeout_s=120, what="the hang's requeue")
    release(slurm_cluster, job)
    records = wait_until(lambda: ended(run), timeout_s=120, what="the trained job to end")
    assert records[job].state == "COMPLETED", records[job]
    limit = wait_until(lambda: ended(limit_run), timeout_s=150, what="the time-limited job, over its cap, to end")
    assert limit[limit_job].state == "FAILED", limit[limit_job]  # not requeued a second time
    assert restarts(slurm_cluster, limit_job) == 1

    seen = [*out.glob("seen-*.json"), *limit_out.glob("seen-*.json")]
    assert len(seen) == 3 * 2 + 2  # every rank of every attempt, none of which had a SLURM client in reach
    copy = carry.folder() + os.sep  # nor the host's hpc, submitit, ...: the copy hpc carried in
    for path in seen:
        record = json.loads(path.read_text())
        assert record["slurm"] == {"on_path": {}, "scontrol_ran": False}, path
        assert {"hpc", "submitit", "cloudpickle"} <= set(record["imported"]), record
        assert all(f.startswith(copy) for f in record["imported"].values()), record

    events = json.loads((out / "checkpoints" / "requeue.json").read_text())["events"]
    assert [(e["kind"], e["requeue"], e["by"]) for e in events] == [("preempt", True, "hpc"), ("hang", True, "hpc")]
    for directory, attempts in ((run.path, 2), (limit_run.path, 1)):  # each request carried out by the host
        settled = sorted(p.parent.name + "/" + p.name for p in (directory / ".host").glob("*/*.done"))
        assert settled == [f"{j}-{n}/request.json.done" for j in (job if directory == run.path else limit_job,)
                           for n in range(attempts)], settled
        assert not list((directory / ".host").glob("*/request.json"))
    # submitit's time-limit handler waited for the host's answer and acted on it (hostact.requeue_on_host)
    log = (limit_run.path / "wait" / "logs" / limit_job / f"{limit_job}_0_log.err").read_text()
    assert log.count("exiting for the rerun") == 1, log[-3000:]

    starts = [json.loads((out / f"start-0-{n}.json").read_text())["step"] for n in range(3)]
    assert not starts[0] and 0 < starts[1] < starts[2], starts  # each attempt resumed further on
    (report,) = [json.loads(p.read_text()) for p in (out / HANGS).glob(f"*/{REPORT}")]
    assert report["stuck"] == [1] and report["decision"]["requeue"], report
