"""The Python API on the real local SLURM cluster: a short-form pipeline to completion, cancel, and
the scheduler's refusal as a SubmissionError, all in this process.

    python -m pytest tests/slurm/test_api_cluster.py -m slurm

hpc.submit("langsplat", ...) with run.wait() and Run.attach(...).status() against python -m
hpc.status --json is checked on the LangSplat run of tests/slurm/test_langsplat.py, which serves both.
"""
import subprocess
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


def test_cancel_leaves_no_job_of_the_run_in_squeue(slurm_cluster, tmp_path):
    # held back an hour by sbatch --begin: queued, never started, so the test costs no CPU
    run = hpc.submit(SHORT, cluster="slurm", run_dir=tmp_path / "run", overrides=["stages.shard.extra.begin=now+3600"])
    ids = {t["job_id"].split("_")[0] for t in hpc.Run.attach(run.path).status()}
    assert len(ids) == 2
    assert {j.split("_")[0] for j in run.cancel()} == ids

    def gone():
        queued = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True).stdout
        return not {line.split("_")[0] for line in queued.split()} & ids
    wait_until(gone, timeout_s=30, what="the cancelled jobs to leave squeue")
