"""A stage without hpc's loop tells a time limit from a preemption in its `requeued` message
(hpc.rundir.notify, hpc.rundir.stopkind), on the local cluster: one run, two such stages side by side
on a node each; `limit` gets its time-limit signal 10 s in and submitit's own handler requeues it,
`preempt` is preempted for real (hpc.cluster.preempt: SIGTERM, GraceTime, SLURM's own requeue, which
submitit does not see: its next attempt tells it, from sacct). A webhook on 127.0.0.1 hears each once.

    python -m pytest tests/slurm/test_requeue_kinds.py -m slurm
"""
import pytest

from hpc.cluster.preempt import job_field, preempt
from hpc.rundir.run import RunDir
from hpc.slurm import scheduler
from tests.slurm.pipelines import register
from tests.slurm.requeue_helpers import release, wait_for
from tests.test_notify import Hook

pytestmark = pytest.mark.slurm


def test_a_stage_without_hpcs_loop_says_time_limit_or_preemption_when_requeued(slurm_cluster, tmp_path,
                                                                              monkeypatch, request):
    register(monkeypatch, rq="tests.requeue_pipeline")
    from hpc import submit

    hook = Hook()
    request.addfinalizer(hook.close)
    assert submit.main(["rq", "--cluster", "slurm", "--run-dir", str(tmp_path / "run"),
                        f"notify.webhook={hook.url}", "notify.timeout_s=2"]) == 0
    run = RunDir(tmp_path / "run")
    jobs = {t["stage"]: t["job_id"] for t in run.tasks()}
    wait_for(lambda: (run.task_dir("preempt") / "started.txt").exists(), "the preempt stage to start")
    preempt(slurm_cluster, jobs["preempt"], release=False)
    release(slurm_cluster, jobs["preempt"])
    wait_for(lambda: int(job_field(slurm_cluster, jobs["limit"], "Restarts") or 0) == 1, "the time limit's requeue")
    release(slurm_cluster, jobs["limit"])
    wait_for(lambda: all(getattr(scheduler.query([j]).get(j), "state", "") == "COMPLETED" for j in jobs.values()),
             "both stages to complete", timeout=180)
    wait_for(lambda: len(hook.bodies) >= 5, "the run's messages")
    said = {b["task"]: b["detail"] for b in hook.bodies if b["event"] == "requeued"}
    assert sorted(hook.events()) == sorted([("requeued", "limit"), ("requeued", "preempt"), ("stage_completed", "limit"),
                                            ("stage_completed", "preempt"), ("run_completed", "run")]), hook.events()
    assert said["limit"].startswith("timeout: submitit: time limit near ("), said
    assert said["preempt"] == "preempt: attempt 0 preempted (SLURM State=PREEMPTED)", said
