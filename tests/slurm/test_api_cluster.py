"""The Python API on the real local SLURM cluster: a short-form pipeline to completion, its results
and logs, cancel, wait's deadline, a sweep waited for to its last task, and the scheduler's refusal as
a SubmissionError, all in this process.

    python -m pytest tests/slurm/test_api_cluster.py -m slurm

hpc.submit("langsplat", ...) with run.wait() and Run.attach(...).status() against python -m
hpc.status --json is checked on the LangSplat run of tests/slurm/test_langsplat.py, which serves both.
"""
import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hpc
from hpc.pipeline.executor import StageContext
from tests.slurm.test_pipeline import wait_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slurm


@pytest.fixture(autouse=True)
def _root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the snapshot is taken of the checkout, and the jobs import this file from it


def shard(ctx: StageContext) -> dict:
    (ctx.stage_dir / "shard.txt").write_text(f"{ctx.item}:{ctx.env.world_size}")
    return {"item": ctx.item}


def gather(ctx: StageContext) -> dict:
    found = sorted((ctx.run_dir / "shard").glob("task-*/shard.txt"))
    (ctx.stage_dir / "gathered.txt").write_text(" ".join(p.read_text() for p in found))
    return {"shards": len(found)}


SHORT = hpc.define("short", hpc.stage(shard, items=[0, 1], cpus_per_task=1, time_min=5, tasks_per_node=2),
                   hpc.stage(gather, after=[shard], cpus_per_task=1, time_min=5))


def test_a_short_form_pipeline_completes_and_the_interpreter_survives_bad_requests(slurm_cluster, tmp_path):
    with pytest.raises(hpc.ConfigError, match="stages.shard.nodez"):  # refused before anything is submitted
        hpc.submit(SHORT, cluster="slurm", run_dir=tmp_path / "bad", overrides=["stages.shard.nodez=2"])
    with pytest.raises(hpc.SubmissionError, match="node configuration is not available") as refused:
        hpc.submit(SHORT, cluster="slurm", run_dir=tmp_path / "refused", overrides=["stages.shard.gpus_per_node=9"])
    assert "sbatch" in refused.value.scheduler_says and "HINT" in str(refused.value)
    run = hpc.submit(SHORT, cluster="slurm", run_dir=tmp_path / "run")
    rows = run.wait(timeout=180, poll_s=1)
    assert {r["task"]: r["state"] for r in rows} == {"shard[0]": "COMPLETED", "shard[1]": "COMPLETED",
                                                     "gather": "COMPLETED"}
    assert (run.path / "gather" / "gathered.txt").read_text() == "0:2 1:2"  # 2 ranks per shard task
    assert "[hpc] stage shard item 1 rank 1/2" in run.logs("shard", 1, rank=1)
    with pytest.raises(ValueError, match=r"rank 2 of job .* has no log.*ranks that logged: \[0, 1\]"):
        run.logs("shard", 1, rank=2)
    assert run.result("gather") == {"shards": 2} and run.result("shard", 1) == {"item": 1}  # submitit's pickles


def test_cancel_leaves_no_job_of_the_run_in_squeue(slurm_cluster, tmp_path):
    # held back an hour by sbatch --begin: queued, never started, so the test costs no CPU
    run = hpc.submit(SHORT, cluster="slurm", run_dir=tmp_path / "run", overrides=["stages.shard.extra.begin=now+3600"])
    ids = {t["job_id"].split("_")[0] for t in hpc.Run.attach(run.path).status()}
    assert len(ids) == 2
    for timeout, poll_s in ((1.5, 30), (3, 2)):  # wait() raises at its deadline: not a poll early, nor at once
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=f"after {timeout} s"):
            run.wait(timeout=timeout, poll_s=poll_s)
        assert timeout <= time.monotonic() - started < timeout + 5
    with pytest.raises(hpc.ResultError, match=r"shard\[0\] has no result: it is PENDING.*HINT: run.wait"):
        run.result("shard", 0)
    assert {j.split("_")[0] for j in run.cancel()} == ids

    def gone():
        queued = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True).stdout
        return not {line.split("_")[0] for line in queued.split()} & ids
    wait_until(gone, timeout_s=30, what="the cancelled jobs to leave squeue")


@dataclasses.dataclass
class RaceSettings:
    sleep_s: float = 15.0  # how long item 1 works; item 0 raises at once


def racer(ctx: StageContext) -> int:
    if ctx.item == 0:
        raise RuntimeError("racer: item 0 fails at once")
    time.sleep(ctx.cfg["race"]["sleep_s"])
    return ctx.item


RACE = hpc.define("race", hpc.stage(racer, items=[0, 1], cpus_per_task=1, time_min=5), config=RaceSettings)


def test_a_sweep_is_waited_for_until_its_last_task_ended_when_one_failed_at_once(slurm_cluster, tmp_path):
    """One point whose item 0 fails at once while item 1 works on: the point shows FAILED from then
    on, and both python -m hpc.submit --sweep --wait and Sweep.wait() go on until item 1 ended. The
    API's item 1 works longer than the command's, so it still works when Sweep.wait() starts."""
    argv = ["tests.slurm.test_api_cluster:RACE", "--cluster", "slurm", "--run-dir", str(tmp_path / "command"),
            "--sweep", "race.sleep_s=8", "--wait"]
    command = subprocess.Popen([sys.executable, "-m", "hpc.submit", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    sweep = hpc.submit(RACE, cluster="slurm", run_dir=tmp_path / "api", sweep=["race.sleep_s=25"])
    out = command.communicate(timeout=180)[0]
    assert _running(hpc.Sweep(tmp_path / "command")) == [], out[-2000:]
    assert command.returncode == 1, out[-2000:]  # a point failed
    assert _running(sweep), "the API's item 1 should still be working: the test would prove nothing"
    (row,) = sweep.wait(timeout=180, poll_s=1)
    assert _running(sweep) == []
    assert (row["state"], row["tasks"], row["active"]) == ("FAILED", "1/2", 0)
    assert sweep.result(row["point"], "racer", 1) == 1
    with pytest.raises(hpc.ResultError, match="racer.0. failed: RuntimeError: racer: item 0 fails at once"):
        sweep.result({"race.sleep_s": 25}, "racer", 0)


def _running(sweep: hpc.Sweep) -> list:
    """The sweep's jobs that squeue shows running."""
    ids = {t["job_id"] for run in sweep.points().values() for t in run.status()}
    listed = subprocess.run(["squeue", "-h", "-o", "%i %t"], capture_output=True, text=True, check=True).stdout
    return [line for line in listed.splitlines() if line.split()[0] in ids and line.split()[1] == "R"]
