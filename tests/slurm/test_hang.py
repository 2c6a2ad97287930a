"""A hung rank on the real local cluster: one rank of a 2 x 2 job stops itself, the watchdog of the
others saves their stacks, names the stuck rank and its host, and requeues the job, which resumes
from its last checkpoint and finishes; the run's webhook hears the hang verdict, the stage and the
run completed, once each, in order (hpc.rundir.notify).

    CI=true python -m pytest tests/slurm/test_hang.py -q -p no:cacheprovider

The job (tests/hang_pipeline.py) has watchdog_s = 3 s and a training collective timeout of 30 s:
without the watchdog the job would fail at that timeout, without stacks and without a requeue.
"""
import json
from pathlib import Path

import pytest

from hpc import submit
from hpc.monitor import status, table
from hpc.cluster.preempt import job_field
from hpc.recovery.hangs import HANGS, REPORT
from hpc.rundir.run import DONE, RunDir
from tests.slurm.test_pipeline import ended, wait_until
from tests.slurm.requeue_helpers import release
from tests.test_notify import Hook
from tests.slurm.pipelines import use_pipelines

pytestmark = pytest.mark.slurm


hang_pipeline = use_pipelines(hang="tests.hang_pipeline")


def reports(out: Path) -> list:
    return [json.loads(p.read_text()) for p in (out / HANGS).glob(f"*/{REPORT}")]


def test_a_stopped_rank_is_named_and_its_job_requeued_from_the_last_checkpoint(slurm_cluster, tmp_path, request):
    hook = Hook()  # the run's webhook (hpc.rundir.notify): one message per event, in order
    request.addfinalizer(hook.close)
    # restarts in place off: the requeue is what this test is about (test_restart_in_place.py has the restart)
    assert submit.main(["hang", "--cluster", "slurm", "--run-dir", str(tmp_path / "run"),
                        "stages.train.max_restarts_in_place=0", f"notify.webhook={hook.url}"]) == 0
    run = RunDir(tmp_path / "run")
    ((job, out),) = [(t["job_id"], run.task_dir("train")) for t in run.tasks()]
    (report,) = wait_until(lambda: reports(out), timeout_s=120, what="the watchdog's report")
    wait_until(lambda: int(job_field(slurm_cluster, job, "Restarts") or 0) == 1, what="the requeue")
    release(slurm_cluster, job)  # a requeued job waits for its begin time
    records = wait_until(lambda: ended(run), timeout_s=120, what="the requeued job to end")
    assert records[job].state == "COMPLETED", records[job]

    host = json.loads((out / "where-3.json").read_text())["host"]
    assert report["stuck"] == [3] and report["hosts"] == {"3": host}, report
    assert report["answered"] == [0, 1, 2] and report["decision"]["requeue"], report
    assert report["idle_s"] < 30  # the watchdog ended it, long before the collective timeout
    attempt = Path(report["dir"])
    for rank in (0, 1, 2):  # each live rank's stacks, its main thread inside the training loop
        assert "hang_workload.py" in (attempt / f"rank-{rank}.txt").read_text(), rank
    done = json.loads((out / DONE).read_text())
    assert done["world_size"] == 4 and done["result"]["step"] == 4
    assert done["result"]["resumed_from"] == 2  # from the last checkpoint before the hang

    (row,) = status.collect(run)
    assert f"rank 3 on {host} did not answer" in row.hang and "requeued" in row.hang
    assert f"train hang: rank 3 on {host}" in table.format_table([row])
    # the verdict reaches the webhook from the rank that decided it (here not rank 0, which the requeue ends)
    assert hook.events() == [("hang", "train"), ("stage_completed", "train"), ("run_completed", "run")], hook.events()
    assert f"rank 3 on {host} did not answer" in hook.bodies[0]["detail"], hook.bodies[0]
    assert hook.bodies[0]["detail"].endswith("; requeued"), hook.bodies[0]
