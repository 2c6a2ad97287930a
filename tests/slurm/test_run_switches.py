"""`python -m hpc.submit run`'s switches on the real local cluster: `--tasks-per-node` alone gives
CPU ranks, `--no-rank-env` runs a one-process script without torchrun's variables, and `accelerate
launch` as the command runs once per node with the topology hpc gives it.

    python -m pytest tests/slurm/test_run_switches.py -m slurm
"""

from __future__ import annotations

import json
import sys

import pytest

from hpc import submit
from hpc.cluster.preempt import job_field
from hpc.rundir.run import RunDir
from tests.slurm.requeue_helpers import wait_for

pytestmark = pytest.mark.slurm

# Each process writes what it was given: its rank variables and the GPUs SLURM granted it.
REPORT = """\
import json, os, pathlib
env = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
                                      "SLURM_PROCID", "SLURM_NTASKS")}
out = pathlib.Path(os.environ["HPC_RUN_DIR"]) / f"task-{os.environ['SLURM_PROCID']}.json"
out.write_text(json.dumps(env))
"""


def submit_and_wait(cluster, run_dir, script, *flags):
    assert submit.main(["run", "--cluster", "slurm", "--run-dir", str(run_dir), "stages.main.cpus_per_task=1",
                        "stages.main.time_min=5", *flags, "--", sys.executable, str(script)]) == 0
    return RunDir(run_dir).tasks()[0]["job_id"]


def reports(run_dir):
    return [json.loads(p.read_text()) for p in sorted(run_dir.glob("task-*.json"))]


def test_tasks_per_node_gives_cpu_ranks_and_no_rank_env_gives_a_plain_process(slurm_cluster, tmp_path):
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    cpu, single = tmp_path / "cpu", tmp_path / "single"
    jobs = {cpu: submit_and_wait(slurm_cluster, cpu, script, "--tasks-per-node", "2"),
            single: submit_and_wait(slurm_cluster, single, script, "--no-rank-env")}
    for run_dir, job in jobs.items():
        wait_for(lambda: job_field(slurm_cluster, job, "JobState") == "COMPLETED", f"job {job} to complete",
                 timeout=180)
    two = reports(cpu)
    assert [(r["RANK"], r["WORLD_SIZE"], r["SLURM_NTASKS"]) for r in two] == [("0", "2", "2"), ("1", "2", "2")]
    assert all(not r["CUDA_VISIBLE_DEVICES"] for r in two)  # no GPUs asked for
    one = reports(single)
    assert len(one) == 1 and one[0]["SLURM_NTASKS"] == "1"
    assert one[0]["RANK"] is None and one[0]["WORLD_SIZE"] is None and one[0]["MASTER_PORT"] is None


def test_accelerate_launch_runs_once_per_node_with_the_jobs_topology(slurm_cluster, tmp_path, monkeypatch):
    """Two nodes, no GPUs: hpc passes --num_machines 2, --machine_rank, the main address and port and
    --num_processes 2; the launcher starts one process per node (torchrun under --multi_gpu, told to
    use the CPU), which meet as one world of 2."""
    pytest.importorskip("accelerate")
    from pathlib import Path

    project = tmp_path / "proj"
    project.mkdir()
    (project / "train_accelerate.py").write_text(
        (Path(__file__).resolve().parents[1] / "frameworks" / "train_accelerate.py").read_text())
    monkeypatch.chdir(project)
    monkeypatch.setenv("MAX_STEPS", "6")
    monkeypatch.setenv("STEP_SLEEP", "0")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")  # what `accelerate config` writes as use_cpu
    run_dir = tmp_path / "per-node"
    assert submit.main(["run", "--cluster", "slurm", "--run-dir", str(run_dir), "--nodes", "2", "--gpus-per-node",
                        "0", "stages.main.cpus_per_task=1", "stages.main.time_min=5", "--", "accelerate", "launch",
                        "--multi_gpu", "train_accelerate.py"]) == 0
    job = RunDir(run_dir).tasks()[0]["job_id"]
    wait_for(lambda: job_field(slurm_cluster, job, "JobState") in {"COMPLETED", "FAILED"}, f"job {job} to end",
             timeout=240)
    err = (run_dir / "main" / "logs" / job / f"{job}_0_log.err").read_text()
    assert job_field(slurm_cluster, job, "JobState") == "COMPLETED", err[-3000:]
    got = json.loads((run_dir / "main" / "work" / "progress.json").read_text())
    assert got["world"] == 2 and got["step"] == 6
