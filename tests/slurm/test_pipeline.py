"""Pipelines on the real local SLURM cluster: afterok ordering, failed dependencies, resubmission,
the `run` pipeline. Uses the tiny test pipeline (tests/tiny_pipeline.py), not the LangSplat trainer.

    python -m pytest tests/slurm/test_pipeline.py -m slurm
"""
import json
import re
import subprocess
import sys
import time
from datetime import datetime

import pytest

from hpc.slurm import scheduler
from hpc import submit
from hpc.monitor import status, table
from hpc import status as status_cmd
from hpc.rundir.run import RunDir
from tests.test_notify import Hook
from tests.slurm.pipelines import ROOT, use_pipelines

pytestmark = pytest.mark.slurm


tiny = use_pipelines(tiny="tests.tiny_pipeline")


def run_tiny(run_dir, *overrides):
    code = submit.main(["tiny", "--cluster", "slurm", "--run-dir", str(run_dir), "stages.first.partition=low",
                        "stages.second.nodes=2", "stages.second.tasks_per_node=2", *overrides])
    assert code == 0
    return RunDir(run_dir)


def wait_until(pred, timeout_s=120, what="condition"):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def job_ids(run):
    return {(t["stage"], t["item"]): t["job_id"] for t in run.tasks()}


def ended(run):
    ids = set(job_ids(run).values())
    records = scheduler.query(ids)  # a just-submitted job may not be in sacct yet: wait for all
    return records if set(records) == ids and all(r.state not in scheduler.ACTIVE for r in records.values()) else None


def test_stage2_array_tasks_start_after_stage1_ends(slurm_cluster, tmp_path):
    run = run_tiny(tmp_path / "run", "tiny.sleep_s=2")
    records = wait_until(lambda: ended(run), what="all jobs to end")
    ids = job_ids(run)
    first = records[ids[("first", None)]]
    assert first.state == "COMPLETED"
    for item in (0, 1, 2):
        task = records[ids[("second", item)]]
        assert task.state == "COMPLETED", task
        assert datetime.fromisoformat(task.start) >= datetime.fromisoformat(first.end), (task, first)
        assert (run.task_dir("second", item) / f"out-{item}.txt").exists()
    rows = status.collect(run)
    assert [r.state for r in rows] == ["COMPLETED"] * 4
    assert all(r.outputs for r in rows)
    # SLURM opens a task's logs in a folder it does not create: the array's tasks share one, made
    # once after sbatch, not one per task; each task's logs are found in it
    array = ids[("second", 0)].split("_")[0]
    folders = sorted(p.name for p in (run.path / "second" / "logs").iterdir() if p.is_dir())
    assert folders == [array], folders
    for item in (0, 1, 2):
        log = run.log_path("second", ids[("second", item)])
        assert log.parent.name == array and f"stage second item {item} rank 0/" in log.read_text(), log


def counting_path(tmp_path):
    """PATH with wrappers for SLURM's clients that log each call, then run the real one."""
    import os
    import shutil

    shims, log = tmp_path / "shims", tmp_path / "calls.log"
    shims.mkdir()
    for name in ("sacct", "squeue", "scontrol", "sinfo", "sbatch", "scancel"):
        real = shutil.which(name)
        (shims / name).write_text(f"#!/bin/sh\necho {name} >> {log}\nexec {real} \"$@\"\n")
        (shims / name).chmod(0o755)
    return f"{shims}{os.pathsep}{os.environ['PATH']}", log


def test_stage1_failure_ends_stage2_unwatched_and_status_says_why(slurm_cluster, tmp_path, capsys):
    """Nobody waits on the run (submission returns at once): SLURM itself ends the tasks whose afterok
    can never be satisfied (sbatch --kill-on-invalid-dep), within seconds, instead of keeping them
    pending forever; hpc.status says why they never ran, and a resubmission runs them."""
    import os

    run = run_tiny(tmp_path / "run", "tiny.fail_first=true")
    ids = job_ids(run)
    submitted = time.time()
    records = wait_until(lambda: ended(run), timeout_s=60, what="SLURM to end stage 2 by itself")
    assert time.time() - submitted < 60
    assert {records[ids[("second", i)]].state for i in (0, 1, 2)} == {"CANCELLED"}
    # unstarted: no node ever (sacct gives a cancelled array task its end as its start)
    assert all(records[ids[("second", i)]].nodes in ("", "None assigned") for i in (0, 1, 2)), records
    rows = {r.task: r for r in status.collect(run)}
    assert rows["first"].state == "FAILED"
    for i in (0, 1, 2):
        assert rows[f"second[{i}]"].state == "NEVER", rows[f"second[{i}]"]
        assert rows[f"second[{i}]"].why.startswith(
            "never: waits on stage first which FAILED (afterok), so SLURM ended it unstarted"), rows[f"second[{i}]"]
    assert not (run.task_dir("second", 0) / "done").exists()
    # the command line says the same from exactly one scheduler call
    path, log = counting_path(tmp_path)
    out = subprocess.run([sys.executable, "-m", "hpc.status", str(run.path)], capture_output=True, text=True,
                         env={**os.environ, "PATH": path}, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert log.read_text().split() == ["sacct"]
    assert out.stdout.count("never: waits on stage first which FAILED (afterok), so SLURM ended it") == 3, out.stdout
    # a dry run into this run dir reads the state and changes nothing: no sbatch, no file written
    # (manifest bytes, config, lock)
    files = {p: p.read_bytes() for p in run.path.iterdir() if p.is_file()}
    log.write_text("")
    out = subprocess.run([sys.executable, "-m", "hpc.submit", "tests.tiny_pipeline", "--dry-run", "--run-dir",
                          str(run.path)], capture_output=True, text=True, env={**os.environ, "PATH": path}, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "stage second: items [0, 1, 2]" in out.stdout  # what a real resubmission would do
    assert not {"scancel", "sbatch"} & set(log.read_text().split()), log.read_text()
    assert {p: p.read_bytes() for p in run.path.iterdir() if p.is_file()} == files
    # they were not done: a resubmission submits every task again, and they run
    capsys.readouterr()
    assert submit.main(["tiny", "--cluster", "slurm", "--run-dir", str(run.path), "tiny.fail_first=false"]) == 0
    assert "second: items [0, 1, 2]" in capsys.readouterr().out
    again = job_ids(run)
    assert all(again[k] != ids[k] for k in ids)
    wait_until(lambda: ended(run), what="the resubmitted run to end")
    assert {r.task: r.state for r in status.collect(run)} == {
        "first": "COMPLETED", **{f"second[{i}]": "COMPLETED" for i in (0, 1, 2)}}


def test_stage2_pending_on_a_failed_stage1_is_never_and_cancelled_by_hpc_cancel(slurm_cluster, tmp_path, capsys):
    """A site or a config that keeps such jobs queued (stages.second.extra={"kill-on-invalid-dep": "no"}):
    status names them NEVER, and python -m hpc.cancel cancels them."""
    run = run_tiny(tmp_path / "run", "tiny.fail_first=true", 'stages.second.extra={"kill-on-invalid-dep": "no"}')
    ids = job_ids(run)

    def orphaned():
        rows = {r.task: r for r in status.collect(run)}
        return rows if rows["first"].state == "FAILED" and all(
            rows[f"second[{i}]"].state == "NEVER" for i in (0, 1, 2)) else None

    rows = wait_until(orphaned, what="stage 2 to be recognised as never starting")
    assert rows["second[0]"].why.startswith("never: waits on stage first which FAILED (afterok). HINT:")
    assert "hpc.cancel" in rows["second[0]"].why
    assert scheduler.query([ids[("second", 1)]])[ids[("second", 1)]].state == "PENDING"
    from hpc import cancel

    assert cancel.main([str(run.path)]) == 0
    assert ids[("second", 1)] in capsys.readouterr().out
    records = wait_until(lambda: ended(run), what="orphans to be cancelled")
    assert {records[ids[("second", i)]].state for i in (0, 1, 2)} == {"CANCELLED"}


def test_a_failing_rank_ends_its_task_at_once(slurm_cluster, tmp_path, request):
    # srun --kill-on-bad-exit=1: rank 1 raises, rank 0 would sleep 600 s (beyond the 5 min time
    # limit); the step must end within seconds. It fails the same way once restarted in place, and
    # the job ends FAILED: the run's webhook (an HTTP server on 127.0.0.1) hears `task failed` once,
    # for the job's end, from rank 1, whose error and log it names, after `first`'s stage completed.
    hook = Hook()
    request.addfinalizer(hook.close)
    run = run_tiny(tmp_path / "run", "tiny.parts=[0]", "tiny.fail_rank=1", f"notify.webhook={hook.url}",
                   "notify.timeout_s=2")
    wait_until(lambda: ended(run), timeout_s=90, what="the failing task to end")
    states = {r.task: r.state for r in status.collect(run)}
    assert states == {"first": "COMPLETED", "second[0]": "FAILED"}
    job = job_ids(run)[("second", 0)]
    err = run.log_path("second", job, rank=1, stream="err").read_text()
    assert "failing on request (tiny.fail_rank)" in err
    logs = "".join(p.read_text() for p in (run.path / "second" / "logs").rglob("*_log.err"))
    assert "restarted in place as step 1" in logs, logs[-3000:]  # the wrapper's line: two srun steps failed
    wait_until(lambda: len(hook.bodies) >= 2, 30, "the run's messages")
    time.sleep(3)  # a second task_failed, from the other step or rank, would be here by now
    assert hook.events() == [("stage_completed", "first"), ("task_failed", "second[0]")], hook.bodies
    said = hook.bodies[1]["text"]
    assert "RuntimeError: second: rank 1 failing on request (tiny.fail_rank)" in said, said
    assert f"HINT: python -m hpc.logs {run.path} --stage second --task 0 --rank 1 --err" in said, said


def test_resubmission_reruns_only_the_failed_array_task(slurm_cluster, tmp_path, capsys):
    run = run_tiny(tmp_path / "run", "tiny.fail_items=[1]")
    wait_until(lambda: ended(run), what="first attempt to end")
    before = job_ids(run)
    states = {r.task: r.state for r in status.collect(run)}
    assert states == {"first": "COMPLETED", "second[0]": "COMPLETED", "second[1]": "FAILED",
                      "second[2]": "COMPLETED"}
    capsys.readouterr()
    assert submit.main(["tiny", "--cluster", "slurm", "--run-dir", str(run.path), "tiny.fail_items=[]"]) == 0
    out = capsys.readouterr().out
    assert "second: items [1]" in out and "skip first: done" in out
    after = job_ids(run)
    changed = {k for k in after if after[k] != before[k]}
    assert changed == {("second", 1)}
    wait_until(lambda: ended(run), what="the resubmitted task to end")
    assert (run.task_dir("second", 1) / "out-1.txt").exists()
    manifest = json.loads(run.manifest_path.read_text())
    assert len(manifest["tasks"]["second[1]"]["jobs"]) == 2  # both attempts are kept


def test_later_stage_waits_for_resubmitted_and_still_running_array_tasks(slurm_cluster, tmp_path, capsys):
    """second[1] fails while second[2] still runs; the resubmission re-runs second[1] and `third`,
    which must wait for both the new task and the old array's running one (named as array tasks:
    afterok on the whole old array would wait on the failed task for ever)."""
    run = run_tiny(tmp_path / "run", "tiny.third=true", "tiny.fail_items=[1]", "tiny.slow_items=[2]",
                   "tiny.slow_s=25", "stages.second.nodes=1", "stages.second.tasks_per_node=1")
    ids = job_ids(run)

    def second_1_failed():
        rows = {r.task: r for r in status.collect(run)}
        return rows if rows["second[1]"].state == "FAILED" and rows["third"].state == "NEVER" else None

    rows = wait_until(second_1_failed, what="second[1] to fail and third to be orphaned")
    assert rows["second[2]"].state in ("PENDING", "RUNNING")
    capsys.readouterr()
    assert submit.main(["tiny", "--cluster", "slurm", "--run-dir", str(run.path), "tiny.fail_items=[]"]) == 0
    after = job_ids(run)
    assert {k for k in after if after[k] != ids[k]} == {("second", 1), ("third", None)}
    deps = run.dependencies()[after[("third", None)]]
    assert sorted(deps) == sorted([ids[("second", 2)], after[("second", 1)]])
    records = wait_until(lambda: ended(run), timeout_s=180, what="every job to end")
    third, slow = records[after[("third", None)]], records[ids[("second", 2)]]
    assert third.state == "COMPLETED", table.format_table(status.collect(run))
    assert datetime.fromisoformat(third.start) >= datetime.fromisoformat(slow.end)


def test_run_pipeline_exports_torchrun_variables_and_checkpoint_dir(slurm_cluster, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import json, os, pathlib\n"
        "keys = ['RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT']\n"
        "out = pathlib.Path(os.environ['HPC_CHECKPOINT_DIR']) / f\"rank-{os.environ['RANK']}.json\"\n"
        "out.write_text(json.dumps({k: os.environ[k] for k in keys}))\n")
    run_dir = tmp_path / "run"
    assert submit.main(["run", "--cluster", "slurm", "--run-dir", str(run_dir), "--nodes", "2",
                        "--gpus-per-node", "2", "stages.main.cpus_per_task=1", "--",
                        sys.executable, str(script)]) == 0
    run = RunDir(run_dir)
    records = wait_until(lambda: ended(run), what="the run job to end")
    assert [r.state for r in records.values()] == ["COMPLETED"]
    seen = [json.loads(p.read_text()) for p in sorted((run_dir / "main" / "checkpoints").glob("rank-*.json"))]
    assert sorted(int(s["RANK"]) for s in seen) == [0, 1, 2, 3]
    assert {s["WORLD_SIZE"] for s in seen} == {"4"} and {s["LOCAL_WORLD_SIZE"] for s in seen} == {"2"}
    assert len({(s["MASTER_ADDR"], s["MASTER_PORT"]) for s in seen}) == 1


RESUMABLE = """\
import os, pathlib, sys, time
ckpt = pathlib.Path(os.environ["HPC_CHECKPOINT_DIR"]) / f"step-rank{os.environ['RANK']}"
step = int(ckpt.read_text()) if ckpt.exists() else 0
print(f"resumed from step {step} restart {os.environ.get('SLURM_RESTART_COUNT', '0')}", flush=True)
while step < int(sys.argv[1]):
    time.sleep(0.5)
    step += 1
    tmp = ckpt.with_suffix(".tmp"); tmp.write_text(str(step)); os.replace(tmp, ckpt)
print(f"finished at step {step}", flush=True)
"""


def test_run_pipeline_is_requeued_on_preemption_and_resumes(slurm_cluster, tmp_path):
    from hpc.cluster.preempt import preempt

    script = tmp_path / "resumable.py"
    script.write_text(RESUMABLE)
    run_dir = tmp_path / "run"
    assert submit.main(["run", "--cluster", "slurm", "--run-dir", str(run_dir), "--nodes", "1",
                        "--gpus-per-node", "2", "stages.main.cpus_per_task=1", "stages.main.partition=low",
                        "--", sys.executable, str(script), "30"]) == 0
    run = RunDir(run_dir)
    job_id = job_ids(run)[("main", None)]
    ckpt = run_dir / "main" / "checkpoints" / "step-rank0"
    wait_until(lambda: ckpt.exists() and int(ckpt.read_text()) >= 4, what="the script to make progress")
    preempt(slurm_cluster, job_id)

    def released_and_ended():
        # SLURM holds a requeued job ~2 min (BeginTime); release it again if preempt's release raced
        if scheduler.query([job_id]).get(job_id, None) and scheduler.query([job_id])[job_id].reason == "BeginTime":
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=False)
        return ended(run)

    records = wait_until(released_and_ended, timeout_s=180, what="the requeued job to finish")
    assert records[job_id].state == "COMPLETED" and records[job_id].restarts >= 1
    log = run.log_path("main", job_id).read_text()
    resumed = [int(line.split()[3]) for line in log.splitlines() if line.startswith("resumed from step")]
    assert resumed[0] == 0 and resumed[-1] >= 4, log  # the second start continued, not restarted
    assert int(ckpt.read_text()) == 30 and run.is_done("main")
    row = status.collect(run)[0]
    assert row.state == "COMPLETED" and row.restarts >= 1
    # the picture of the run (sacct -D): one bar per attempt, each with the world size it got
    assert status_cmd.main([str(run_dir), "--timeline", str(tmp_path / "run.svg")]) == 0
    svg = (tmp_path / "run.svg").read_text()
    bars = re.findall(r'id="attempt-main-(\d+)-(\d+)"', svg)
    assert bars == [(job_id, str(n)) for n in range(1, row.restarts + 2)], bars
    assert svg.count(">2 ranks<") == len(bars) and "stopped for a preemption" in svg


def test_auto_picks_slurm_and_partitions_come_from_the_cluster(slurm_cluster, tmp_path, capsys):
    assert scheduler.detect("auto") == "slurm"
    assert scheduler.partitions() == ["high", "low"]
    code = submit.main(["tiny", "--dry-run", "--run-dir", str(tmp_path), "stages.first.partition=gpu"])
    assert code == 2
    assert "expected one of ['high', 'low']" in capsys.readouterr().err
    assert submit.main(["tiny", "--dry-run", "--run-dir", str(tmp_path), "stages.first.partition=high"]) == 0
    assert "(executor: slurm)" in capsys.readouterr().out
