"""Code snapshots and run identity on the real local cluster: one job is submitted, the code is edited,
the job is preempted and requeued. Both attempts must run the submitted code and log to one run.

    python -m pytest tests/slurm/test_snapshot.py -m slurm

The user's pipeline lives in a git checkout of its own (tests/snapshot_user.py). The job is
submitted with a begin time in the future, so the edit surely comes before it starts; the test then
starts it at once. The first attempt waits for its preemption and requeues itself, as hpc's stages do.
"""
import json
from pathlib import Path

import pytest

from hpc.slurm import scheduler
from hpc import status, submit
from hpc.cluster.preempt import preempt
from hpc.rundir.run import RunDir
from hpc.rundir import snapcache
from tests import snapshot_user
from tests.slurm.test_pipeline import wait_until

pytestmark = pytest.mark.slurm


def attempts(run):
    path = run.task_dir("main") / "attempts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def preempted(slurm_cluster, tmp_path_factory):
    """(run, status output after the edit, the checkout): a job submitted at v1, the code edited to
    v2 before it started, then preempted once and requeued to the end."""
    try:
        import wandb  # noqa: F401
        use_wandb = True
    except ImportError:
        use_wandb = False
    base = tmp_path_factory.mktemp("snapshot")
    repo = snapshot_user.make_repo(base / "code", "v1")
    with pytest.MonkeyPatch.context() as mp:
        snapshot_user.forget()
        mp.chdir(repo)
        mp.syspath_prepend(str(repo))
        for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
            mp.setenv(name, str(base / "wandb-home"))  # the jobs inherit them: nothing lands in ~
        mp.setenv("WANDB_SILENT", "true")
        run = RunDir(base / "run")
        assert submit.main(["snapuser.pipe", "--cluster", "slurm", "--run-dir", str(run.path),
                            "stages.main.partition=low", "stages.main.extra.begin=now+600",
                            "snap.preempt_wait_s=60", f"snap.wandb={str(use_wandb).lower()}"]) == 0
        snapshot_user.set_version(repo, "v2")  # the live code moves on while the job waits
        job = run.tasks()[0]["job_id"]
        scheduler.start_now(job, slurm_cluster.client_env())
        wait_until(lambda: attempts(run), 90, "the first attempt to start")
        preempt(slurm_cluster, job)
        wait_until(lambda: run.is_done("main"), 90, "the requeued attempt to finish")
        snapshot_user.forget()
    yield run, repo, use_wandb


def test_the_job_and_its_requeue_run_the_submitted_code_not_the_edited_one(preempted, capsys):
    run, repo, _ = preempted
    first, second = attempts(run)
    snap = run.manifest()["snapshot"]
    code = Path(snap["dir"])  # in the store of the run root (hpc.rundir.snapcache)
    assert code == snapcache.store_of(run.path) / snap["hash"]
    assert [a["version"] for a in (first, second)] == ["v1", "v1"]  # the live tree says v2
    assert [a["SLURM_RESTART_COUNT"] or "0" for a in (first, second)] == ["0", "1"]  # unset at first
    assert first["file"] == second["file"] == str(code / "snapuser" / "pipe.py")
    assert first["cwd"] == second["cwd"] == str(code) and first["HPC_SUBMIT_DIR"] == str(repo)
    assert "VERSION = \"v2\"" in (repo / "snapuser" / "pipe.py").read_text()
    assert status.main([str(run.path)]) == 0
    out = capsys.readouterr().out
    assert f"code: snapshot {snap['hash']} of {repo}: the live code differs (1 changed (snapuser/pipe.py))" in out


def test_both_attempts_have_one_run_identity(preempted):
    run, _, _ = preempted
    first, second = attempts(run)
    run_id = run.manifest()["run_id"]
    for key in ("HPC_RUN_ID", "HPC_TASK_RUN_ID", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_RUN_GROUP"):
        assert first[key] == second[key], key
    assert (first["HPC_RUN_ID"], first["WANDB_RUN_ID"]) == (run_id, f"{run_id}-main")


def test_wandb_offline_logs_both_preempted_attempts_to_one_run(preempted):
    run, _, use_wandb = preempted
    if not use_wandb:
        pytest.skip("wandb is not installed (pip install wandb, or pip install -e '.[test]')")
    first, second = attempts(run)
    run_id = run.manifest()["run_id"]
    assert first["wandb"]["id"] == second["wandb"]["id"] == f"{run_id}-main"
    assert first["wandb"]["group"] == second["wandb"]["group"] == run_id
    # offline, each attempt writes its own directory under the one run id; `wandb sync` uploads both
    # into that run (wandb ignores resume offline, and resumes it once online)
    offline = sorted(p.name for p in (run.task_dir("main") / "wandb").glob("offline-run-*"))
    assert len(offline) == 2 and all(name.endswith(f"-{run_id}-main") for name in offline), offline
