"""End to end through submitit's LocalExecutor (the default without SLURM), tiny test pipeline."""
import json
import os
import subprocess
import sys

import pytest

from hpc import plan, submit
from hpc.rundir import RunDir


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

    from hpc.status import collect

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
    assert submit._upstream(job, {"second": ["20_0"]}, run) == ["10_2", "20_0"]
    # the failed 10_1 is in the old array: the dependency names tasks, never the array 10
    assert submit.afterok(submit._upstream(job, {"second": ["20_0"]}, run)) == "afterok:10_2:20_0"
    assert submit.afterok(["9_10", "9_2", "9_2", "7"]) == "afterok:7:9_2:9_10" and submit.afterok([]) is None


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
    from hpc.executor import submission_env

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
    from hpc.rundir import code_version

    (tmp_path / "train.py").write_text("print('hi')\n")
    head = git_checkout(tmp_path)
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    assert submit.main(["run", "--cluster", "debug", "--run-dir", str(run_dir), "--", sys.executable, "train.py"]) == 0
    assert json.loads((run_dir / "manifest.json").read_text())["git_commit"] == head
    assert code_version(None, tmp_path.parent)["git_commit"] is None  # not a checkout: no commit
