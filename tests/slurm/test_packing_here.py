"""A packed stage inside an allocation (`--cluster here`), typed in a real salloc shell on the local
SLURM cluster: each item is its own srun step of one item's GPU, up to `pack` side by side on a node.

    python -m pytest tests/slurm/test_packing_here.py -m slurm
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpc.rundir.run import RunDir
from tests.slurm.test_here import salloc_shell

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slurm


def test_a_packed_stage_in_an_allocation_runs_its_one_gpu_items_two_side_by_side_each_its_own_step(
        slurm_cluster, tmp_path):
    run = RunDir(tmp_path / "r")
    cmd = [sys.executable, "-m", "hpc.submit", "tests.tiny_pipeline", "--cluster", "here", "--run-dir", str(run.path),
           "--no-snapshot", "tiny.parts=[0,1,2,3]", "tiny.sleep_s=2", "stages.second.gpus_per_node=1",
           "stages.second.pack=2"]
    with salloc_shell(tmp_path, "-N", "1", "--ntasks-per-node=2", "--gres=gpu:2", "-t", "10") as env:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "stages.second.pack=2: inside the allocation each item is its own step" in done.stdout, done.stdout
    assert all(run.is_done("second", i) for i in range(4))
    marks = [json.loads((run.task_dir("second", i) / "done").read_text()) for i in range(4)]
    for a, b in ((0, 1), (2, 3)):  # two at a time, side by side
        assert marks[a]["started"] < marks[b]["finished"] and marks[b]["started"] < marks[a]["finished"], marks
    assert min(marks[2]["started"], marks[3]["started"]) >= min(marks[0]["finished"], marks[1]["finished"]), marks
    steps = subprocess.run(["sacct", "-j", env["SLURM_JOB_ID"], "-n", "-P", "-o", "JobName,AllocTRES"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    second = [tres for name, tres in (line.split("|") for line in steps) if name.startswith("hpc-second.")]
    assert len(second) == 4 and all("gres/gpu=1," in tres for tres in second), steps  # each its own GPU
