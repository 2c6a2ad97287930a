"""Run directory: manifest history, done markers, status helpers that read it."""
import json

from hpc.monitor import logs as status_logs
from hpc.monitor import status, table
from hpc.rundir.run import RunDir


def test_manifest_keeps_every_attempt_and_config(tmp_path):
    run = RunDir(tmp_path / "r")
    run.start("tiny", "a: 1\n", "slurm")
    run.record("second", 1, "10_1", "slurm")
    run.record("second", 1, "12_0", "slurm")
    run.start("tiny", "a: 2\n", "slurm", {"git_commit": "abc", "hpc_version": "1"})  # keeps the history
    data = json.loads(run.manifest_path.read_text())
    task = data["tasks"]["second[1]"]
    assert task["job_id"] == "12_0" and [j["job_id"] for j in task["jobs"]] == ["10_1", "12_0"]
    assert len(data["submissions"]) == 2 and data["git_commit"] == "abc"
    assert run.config_path.read_text() == "a: 2\n"


def test_manifest_records_what_each_job_waits_for(tmp_path):
    run = RunDir(tmp_path)
    run.start("tiny", "", "slurm")
    run.record("first", None, "4", "slurm")
    run.record("second", 0, "5_0", "slurm", ["4"])
    run.record("first", None, "6", "slurm")  # resubmitted: the newest attempt counts
    run.record("second", 0, "7_0", "slurm", ["6"])
    assert run.dependencies() == {"6": [], "7_0": ["6"]}
    assert run.job_tasks() == {"4": "first", "6": "first", "5_0": "second[0]", "7_0": "second[0]"}


def test_done_markers_per_task(tmp_path):
    run = RunDir(tmp_path)
    run.mark_done("features", 2, {"result": {"loss": 0.1}})
    assert run.is_done("features", 2) and not run.is_done("features", 1) and not run.is_done("rgb")
    assert run.finished([("features", 2), ("features", 1)]) == frozenset({("features", 2)})
    assert (tmp_path / "features" / "task-2" / "done").exists()


def test_last_progress_reads_tqdm_redraws_and_skips_bookkeeping(tmp_path):
    log = tmp_path / "x.out"
    log.write_text("start\nstep 1/10\rstep 5/10\rstep 9/10\nsubmitit INFO (x) - Exiting\n")
    assert status.last_progress(log) == "step 9/10"
    assert status.last_progress(tmp_path / "missing") == ""


def test_a_failed_tasks_error_is_its_own_last_line_not_the_srun_wrappers_account(tmp_path):
    log = tmp_path / "err"
    log.write_text("Traceback (most recent call last):\nRuntimeError: failing on request\n"
                   "srun: error: n1: task 1: Exited with exit code 1\n"
                   "slurmstepd: error: *** STEP 7.1 ON n1 CANCELLED AT 2026-11-28T22:00:00 ***\n"
                   "[hpc] srun exited 1: not a node failure: left as it is (not restarted in place: same failure)\n")
    assert status_logs.last_error(log) == "RuntimeError: failing on request"
    log.write_text("[hpc] this task's pickle is not unpacked, so it cannot run: gone\n")  # the wrapper's alone
    assert status_logs.last_error(log).startswith("[hpc] this task's pickle")
    assert status_logs.last_error(tmp_path / "missing") == ""


def test_status_table_lists_outputs(tmp_path):
    run = RunDir(tmp_path)
    run.start("tiny", "", "local")
    run.record("first", None, "123", "local")
    run.mark_done("first", None, {})
    (run.task_dir("first") / "model.pt").write_text("x")
    rows = status.collect(run)
    assert [(r.task, r.state, r.outputs) for r in rows] == [("first", "COMPLETED", ["model.pt"])]
    assert "first outputs: model.pt" in table.format_table(rows)


def test_logs_select_by_stage_task_rank_and_names_choices(tmp_path):
    import pytest

    from hpc.monitor import logs

    run = RunDir(tmp_path)
    run.start("langsplat", "", "slurm")
    run.record("rgb", None, "7", "slurm")
    run.record("features", 2, "8_2", "slurm")
    # an array task's logs are in its array's folder; a run submitted before kept one per task
    assert logs.select(run, "features", "2", 3, "out") == [tmp_path / "features/logs/8/8_2_3_log.out"]
    (tmp_path / "features/logs/8_2").mkdir(parents=True)
    assert logs.select(run, "features", "2", 3, "out") == [tmp_path / "features/logs/8_2/8_2_3_log.out"]
    assert len(logs.select(run, None, None, 0, "err")) == 2
    with pytest.raises(ValueError, match=r"expected one of \['features', 'rgb'\]"):
        logs.select(run, "nosuch", None, 0, "out")
    with pytest.raises(ValueError, match=r"expected one of \['2'\]"):
        logs.select(run, "features", "5", 0, "out")


def test_atomic_write_syncs_the_file_and_its_directory(tmp_path, monkeypatch):
    """fsync cannot be observed without a power cut: check that both the file and its directory are
    synced, the directory after the rename (which is what makes the new name durable)."""
    import os
    import stat

    from hpc.fs import atomic

    synced = []
    real = os.fsync

    def recording(fd):
        mode = os.fstat(fd).st_mode
        synced.append(("dir" if stat.S_ISDIR(mode) else "file", (tmp_path / "m.json").exists()))
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    atomic.write_text(tmp_path / "m.json", "{}")
    assert synced == [("file", False), ("dir", True)]
    assert (tmp_path / "m.json").read_text() == "{}" and sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]


def test_failed_atomic_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    import os

    import pytest

    from hpc.fs import atomic

    (tmp_path / "m.json").write_text("old")

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        atomic.write_text(tmp_path / "m.json", "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"] and (tmp_path / "m.json").read_text() == "old"
