"""End to end through submitit's LocalExecutor (the default without SLURM), tiny test pipeline."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc.pipeline import plan
from hpc import submit
from hpc.pipeline import runbook
from hpc.rundir.run import RunDir
from hpc.rundir.snapcache import STORE


@pytest.fixture(autouse=True)
def tiny(monkeypatch):
    monkeypatch.setitem(plan.PIPELINES, "tiny", "tests.tiny_pipeline")
    monkeypatch.delenv("SLURM_CONF", raising=False)


def test_local_run_resubmission_reruns_only_the_failed_task(tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = ["tiny", "--cluster", "local", "--run-dir", str(run_dir), "stages.second.local_tasks=2"]
    assert submit.main([*args, "tiny.fail_items=[2]", "tiny.parts=[1,2]"]) == 1  # item 2 fails
    run = RunDir(run_dir)
    assert run.is_done("first") and run.is_done("second", 1) and not run.is_done("second", 2)
    assert (run_dir / "second" / "task-1" / "out-1.txt").read_text() in ("1 rank 0\n", "1 rank 1\n")
    first_ids = {t["item"]: t["job_id"] for t in run.tasks()}
    capsys.readouterr()
    assert submit.main([*args, "tiny.fail_items=[]"]) == 0
    out = capsys.readouterr().out
    assert "stage second: items [2] 2 rank(s)" in out and "skip second[1]: done marker present" in out
    assert "2 process(es)" in out  # the reduced world size is stated in the plan
    ids = {t["item"]: t["job_id"] for t in run.tasks()}
    assert ids[1] == first_ids[1] and ids[2] != first_ids[2]
    assert run.is_done("second", 2)


def test_failed_first_stage_stops_the_pipeline_locally(tmp_path, capsys):
    assert submit.main(["tiny", "--cluster", "local", "--run-dir", str(tmp_path), "tiny.fail_first=true"]) == 1
    out = capsys.readouterr().out
    assert "stage second: not started, an earlier stage failed" in out
    assert [t["stage"] for t in RunDir(tmp_path).tasks()] == ["first"]
    assert "failing on request" in out  # status shows the task's error line


def test_local_status_shows_elapsed_time_of_finished_tasks(tmp_path):
    import re

    from hpc.monitor.status import collect

    run_dir = tmp_path / "run"
    assert submit.main(["tiny", "--cluster", "local", "--run-dir", str(run_dir), "tiny.parts=[0]",
                        "tiny.sleep_s=1.2"]) == 0
    rows = {r.task: r for r in collect(RunDir(run_dir))}
    assert rows["first"].state == "COMPLETED"
    assert re.fullmatch(r"00:00:0[1-9]", rows["first"].elapsed), rows["first"].elapsed


def test_upstream_after_a_partial_resubmission_keeps_the_earlier_queued_tasks(tmp_path):
    """A later stage waits for the array tasks submitted now and for those of the same stage
    still queued from before; finished tasks (whose jobs SLURM may have purged) are left out."""
    from types import SimpleNamespace

    run = RunDir(tmp_path)
    run.start("tiny", "{}", "slurm")
    for item, jid in ((0, "10_0"), (1, "10_1"), (2, "10_2")):
        run.record("second", item, jid, "slurm")
    run.mark_done("second", 0, {})
    run.record("second", 1, "20_0", "slurm")  # item 1 failed and is resubmitted now; 2 still queued
    run.record("other", None, "30", "slurm")
    job = SimpleNamespace(after=["second"])
    assert runbook.upstream(job, {"second": ["20_0"]}, run) == ["10_2", "20_0"]
    # the failed 10_1 is in the old array: the dependency names tasks, never the array 10
    assert runbook.afterok(runbook.upstream(job, {"second": ["20_0"]}, run)) == "afterok:10_2:20_0"
    assert runbook.afterok(["9_10", "9_2", "9_2", "7"]) == "afterok:7:9_2:9_10" and runbook.afterok([]) is None


def test_local_run_leaves_no_literal_percent_j_folder(tmp_path):
    run_dir = tmp_path / "run"
    assert submit.main(["tiny", "--cluster", "local", "--run-dir", str(run_dir), "tiny.parts=[0]"]) == 0
    for stage in ("first", "second"):
        names = sorted(p.name for p in (run_dir / stage / "logs").iterdir())
        assert "%j" not in names and names, names  # only the jobs' own folders


def test_variables_of_an_enclosing_allocation_do_not_reach_the_jobs(tmp_path, monkeypatch):
    """Submitting from inside an allocation (or a torchrun process): its SLURM_*, SBATCH_* and
    torchrun variables are not the new job's, and the submitting process keeps them."""
    leaked = {"SLURM_JOB_ID": "999", "SLURM_NTASKS": "7", "SLURM_PROCID": "3", "SLURM_NODELIST": "x[1-7]",
              "SLURM_STEP_ID": "0", "SBATCH_PARTITION": "nosuch", "RANK": "5", "WORLD_SIZE": "9",
              "SUBMITIT_EXECUTOR": "slurm"}
    for name, value in leaked.items():
        monkeypatch.setenv(name, value)
    run_dir = tmp_path / "run"
    assert submit.main(["tiny", "--cluster", "local", "--run-dir", str(run_dir), "tiny.parts=[0]",
                        "stages.second.local_tasks=2"]) == 0
    assert (run_dir / "second" / "task-0" / "out-0.txt").read_text() in ("0 rank 0\n", "0 rank 1\n")
    assert (run_dir / "first" / "first.txt").read_text() == "rank 0\n"
    assert {name: os.environ.get(name) for name in leaked} == leaked


def test_hidden_variables_keep_the_client_configuration():
    from hpc.slurm.submitenv import submission_env

    env = {"SLURM_CONF": "/etc/x.conf", "SLURM_CONF_SERVER": "ctl", "SLURM_JOB_ID": "1", "SBATCH_QOS": "q",
           "SRUN_CPUS_PER_TASK": "2", "TORCHELASTIC_RUN_ID": "r", "LOCAL_RANK": "0", "PATH": "/bin",
           "HPC_MASTER_PORT": "1234", "MY_SLURM_NOTE": "kept"}
    before = dict(env)
    with submission_env(env) as hidden:
        assert sorted(env) == ["HPC_MASTER_PORT", "MY_SLURM_NOTE", "PATH", "SLURM_CONF", "SLURM_CONF_SERVER"]
        assert sorted(hidden) == ["LOCAL_RANK", "SBATCH_QOS", "SLURM_JOB_ID", "SRUN_CPUS_PER_TASK",
                                  "TORCHELASTIC_RUN_ID"]
    assert env == before


def git_checkout(path):
    """A git checkout at `path` with one commit; returns its HEAD."""
    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=path, check=True,
                              capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "user code")
    return git("rev-parse", "HEAD")


def test_manifest_records_the_commit_of_the_pipeline_module_and_hpc_version(tmp_path, monkeypatch):
    import hpc

    code = tmp_path / "usercode"
    (code / "userpipes").mkdir(parents=True)
    (code / "userpipes" / "__init__.py").write_text("")
    (code / "userpipes" / "mine.py").write_text("from tests.tiny_pipeline import PIPELINE\n")
    head = git_checkout(code)
    monkeypatch.syspath_prepend(str(code))
    run_dir = tmp_path / "run"
    assert submit.main(["userpipes.mine", "--cluster", "debug", "--run-dir", str(run_dir), "tiny.parts=[0]"]) == 0
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["git_commit"] == head and manifest["code_dir"] == str(code.resolve())
    assert manifest["hpc_version"] == hpc.__version__


def test_manifest_records_the_working_directory_commit_for_a_builtin_pipeline(tmp_path, monkeypatch):
    from hpc.rundir.codeversion import code_version

    (tmp_path / "train.py").write_text("print('hi')\n")
    head = git_checkout(tmp_path)
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    assert submit.main(["run", "--cluster", "debug", "--run-dir", str(run_dir), "--", sys.executable, "train.py"]) == 0
    assert json.loads((run_dir / "manifest.json").read_text())["git_commit"] == head
    assert code_version(None, tmp_path.parent)["git_commit"] is None  # not a checkout: no commit


@pytest.fixture
def user_repo(tmp_path, monkeypatch):
    """A user's pipeline (tests/snapshot_user.py) in its own git checkout, submitted from there."""
    from tests import snapshot_user

    repo = snapshot_user.make_repo(tmp_path / "code", "v1")
    snapshot_user.forget()
    monkeypatch.chdir(repo)
    monkeypatch.syspath_prepend(str(repo))
    yield repo
    snapshot_user.forget()


def attempts(run_dir):
    return [json.loads(line) for line in (run_dir / "main" / "attempts.jsonl").read_text().splitlines()]


def test_local_jobs_import_a_snapshot_of_the_code_and_see_the_run_identity(user_repo, tmp_path, capsys):
    from hpc.rundir import snapshot
    from hpc import status
    from tests.snapshot_user import set_version

    run_dir = tmp_path / "run"
    assert submit.main(["snapuser.pipe", "--cluster", "local", "--run-dir", str(run_dir)]) == 0
    manifest = json.loads((run_dir / "manifest.json").read_text())
    snap, run_id = manifest["snapshot"], manifest["run_id"]
    [seen] = attempts(run_dir)
    code = tmp_path / STORE / snap["hash"]  # in the store of the run root (hpc.rundir.snapcache)
    assert seen["version"] == "v1"  # the uncommitted edit is in the snapshot
    assert seen["file"] == str(code / "snapuser" / "pipe.py") and seen["cwd"] == str(code)
    assert (seen["HPC_CODE_DIR"], seen["HPC_SUBMIT_DIR"]) == (str(code), str(user_repo))
    assert seen["HPC_RUN_ID"] == run_id and seen["WANDB_RUN_ID"] == seen["HPC_TASK_RUN_ID"] == f"{run_id}-main"
    assert (seen["WANDB_RESUME"], seen["WANDB_RUN_GROUP"], seen["MLFLOW_RUN_ID"]) == ("allow", run_id, None)
    assert manifest["tasks"]["main"]["jobs"][0]["code"] == snap["hash"]
    assert f"code: {user_repo} (git checkout) -> {code}" in capsys.readouterr().out
    # the live code moves on: status says so; a resubmission snapshots it, the run id stays
    set_version(user_repo, "v2")
    assert "the live code differs (1 changed (snapuser/pipe.py))" in snapshot.status_line(snap)
    assert status.main([str(run_dir)]) == 0
    assert f"run id: {run_id}" in capsys.readouterr().out
    (run_dir / "main" / "done").unlink()
    assert submit.main(["snapuser.pipe", "--cluster", "local", "--run-dir", str(run_dir)]) == 0
    again = json.loads((run_dir / "manifest.json").read_text())
    assert again["run_id"] == run_id and again["snapshot"]["hash"] != snap["hash"]
    assert [a["version"] for a in attempts(run_dir)] == ["v1", "v2"]
    assert attempts(run_dir)[1]["WANDB_RUN_ID"] == f"{run_id}-main"
    assert snapshot.status_line(again["snapshot"]).endswith("the live code matches it")


def test_no_snapshot_runs_the_live_tree_and_the_dry_run_says_what_would_be_copied(user_repo, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert submit.main(["snapuser.pipe", "--cluster", "local", "--run-dir", str(run_dir), "--dry-run"]) == 0
    assert f"note: code: the git checkout {user_repo} is copied into {tmp_path / STORE}/" in capsys.readouterr().out
    assert not run_dir.exists()
    assert submit.main(["snapuser.pipe", "--cluster", "local", "--run-dir", str(run_dir), "--no-snapshot"]) == 0
    [seen] = attempts(run_dir)
    assert seen["file"] == str(user_repo / "snapuser" / "pipe.py") and seen["HPC_CODE_DIR"] is None
    assert json.loads((run_dir / "manifest.json").read_text())["snapshot"] is None
    assert not (run_dir / "code").exists() and not (tmp_path / STORE).exists()
    assert "\n  snapshot: false\n" in (run_dir / "config.yaml").read_text()  # kept for resubmissions


def test_a_snapshot_over_the_limit_submits_nothing(user_repo, tmp_path, capsys):
    (user_repo / "notes.txt").write_text("x" * 200_000)
    run_dir = tmp_path / "run"
    assert submit.main(["snapuser.pipe", "--cluster", "local", "--run-dir", str(run_dir),
                        "run.snapshot_max_mb=0.1"]) == 2
    err = capsys.readouterr().err
    assert "over run.snapshot_max_mb=0.1" in err and "HINT" in err and "--no-snapshot" in err
    assert not (run_dir / "manifest.json").exists()


def test_same_snapshot_resubmits_the_run_s_code_not_the_live_tree(user_repo, tmp_path):
    from tests.snapshot_user import set_version

    run_dir = tmp_path / "run"
    assert submit.main(["snapuser.pipe", "--cluster", "local", "--run-dir", str(run_dir)]) == 0
    first = json.loads((run_dir / "manifest.json").read_text())["snapshot"]
    set_version(user_repo, "v2")
    (run_dir / "main" / "done").unlink()
    assert submit.main(["snapuser.pipe", "--cluster", "local", "--run-dir", str(run_dir), "--same-snapshot"]) == 0
    assert json.loads((run_dir / "manifest.json").read_text())["snapshot"]["hash"] == first["hash"]
    assert [a["version"] for a in attempts(run_dir)] == ["v1", "v1"]


def test_a_sweep_takes_one_snapshot_for_its_points_and_gives_each_point_its_run_id(tmp_path, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # the points' jobs import tests.tiny_pipeline
    sweep_dir = tmp_path / "sweep"
    assert submit.main(["tiny", "--cluster", "local", "--run-dir", str(sweep_dir), "tiny.parts=[0]",
                        "--sweep", "tiny.sleep_s=0,0.1"]) == 0
    manifests = [json.loads(p.read_text()) for p in sorted(sweep_dir.rglob("manifest.json"))]
    assert len(manifests) == 2 and len({m["run_id"] for m in manifests}) == 2
    [code] = {m["snapshot"]["dir"] for m in manifests}
    assert Path(code).parent == tmp_path / STORE  # the store of the sweep's root
    assert {j["code"] for m in manifests for t in m["tasks"].values() for j in t["jobs"]} == {Path(code).name}


def test_a_sweep_points_logs_are_linked_by_its_task_and_found_by_hpc_logs(tmp_path, monkeypatch):
    """A sweep's arrays keep their logs in the sweep's stage folders; a point's <stage>/logs link to
    them is made by its task when it starts (not at submission), and hpc.logs finds a point's task
    log through it, or in the sweep's folder where a task failed before it could link."""
    from hpc.monitor import logs
    from hpc.rundir.sweepdir import SweepDir

    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # the points' jobs import tests.tiny_pipeline
    sweep = SweepDir(tmp_path / "sweep")
    assert submit.main(["tiny", "--cluster", "local", "--run-dir", str(sweep.path), "tiny.parts=[0]",
                        "--sweep", "tiny.sleep_s=0,0.1"]) == 0
    for sig in sweep.record()["points"]:
        run = sweep.point(sig)
        for stage in ("first", "second"):
            assert (run.path / stage / "logs").is_symlink()
            [found] = logs.select(run, stage, None, 0, "out")
            assert found.is_file() and "[hpc] stage" in found.read_text()
        (run.path / "second" / "logs").unlink()  # as if its task had failed before linking it
        [found] = logs.select(run, "second", None, 0, "out")
        assert found.parent.parent == sweep.path / "second" / "logs" and found.is_file()
