"""End to end through submitit's LocalExecutor (the default without SLURM), tiny test pipeline."""
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
