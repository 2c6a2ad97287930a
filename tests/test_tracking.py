"""Run identity for experiment trackers (hpc.rundir.tracking): ids, the variables a task exports, mlflow's record."""
import json
import re
from types import SimpleNamespace

from hpc.rundir import tracking
from hpc.rundir.run import RunDir


def test_run_ids_are_plain_unique_and_name_their_run_directory():
    a, b = tracking.new_run_id("langsplat-20260101-120000"), tracking.new_run_id("langsplat-20260101-120000")
    assert a != b and a.startswith("langsplat-20260101-120000-")
    odd = tracking.new_run_id("a/b#c?d%e:f " + "x" * 100)
    assert re.fullmatch(r"[A-Za-z0-9_.-]+", odd) and len(odd) <= tracking.MAX_ID
    assert tracking.new_run_id("///").startswith("run-")


def test_task_run_ids_are_stable_and_fit_wandb():
    assert tracking.task_run_id("r-1a2b", "features", 2) == "r-1a2b-features-2"
    assert tracking.task_run_id("r-1a2b", "rgb") == "r-1a2b-rgb"
    long = tracking.task_run_id("r" * 60, "stage", "item/with:odd#chars")
    assert len(long) == tracking.MAX_ID and long == tracking.task_run_id("r" * 60, "stage", "item/with:odd#chars")
    assert long != tracking.task_run_id("r" * 60, "stage", "other")


def test_every_task_gets_the_run_id_and_wandb_resumes_its_own_run(tmp_path):
    env = tracking.environ("r-1a2b", "features", 2, tmp_path)
    assert env == {"HPC_RUN_ID": "r-1a2b", "HPC_TASK_RUN_ID": "r-1a2b-features-2", "WANDB_RUN_ID": "r-1a2b-features-2",
                   "WANDB_RESUME": "allow", "WANDB_RUN_GROUP": "r-1a2b"}  # no MLFLOW_RUN_ID: no run exists yet


def fake_mlflow(run_id):
    run = SimpleNamespace(info=SimpleNamespace(run_id=run_id)) if run_id else None
    return SimpleNamespace(active_run=lambda: None, last_active_run=lambda: run)


def test_mlflow_resumes_only_a_run_an_earlier_attempt_started(tmp_path):
    tracking.record(tmp_path, modules={})  # the stage never imported mlflow: nothing recorded
    tracking.record(tmp_path, modules={"mlflow": fake_mlflow(None)})  # imported, no run started
    assert not (tmp_path / tracking.TRACKING).exists()
    tracking.record(tmp_path, modules={"mlflow": fake_mlflow("0a1b2c")})
    assert json.loads((tmp_path / tracking.TRACKING).read_text()) == {"mlflow_run_id": "0a1b2c"}
    assert tracking.environ("r", "s", None, tmp_path)["MLFLOW_RUN_ID"] == "0a1b2c"


def test_the_run_id_is_made_once_and_kept_by_every_resubmission(tmp_path):
    run = RunDir(tmp_path / "run-x")
    first = run.start("p", "{}\n", "local")
    assert first.startswith("run-x-") and run.start("p", "{}\n", "slurm") == first
    assert run.manifest()["run_id"] == first
