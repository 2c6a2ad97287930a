"""Any checkpoint TrainLoop writes resumes under either strategy on any world size: the whole matrix.

    python -m pytest -q tests/test_any_resume.py

{DDP, FSDP} x {1, 2, 4} to {DDP, FSDP} x {1, 2, 4}: 36 (source, target) pairs of real gloo groups,
through TrainLoop (tests/anyresume_workload.py). Six launches in all: one per source world size
saves under both strategies, one per target world size resumes every source under both. The
model and optimizer state loaded must equal the saved one exactly (DCP copies values, nothing
is recomputed), and one more step must train.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

import ranklaunch
from test_ddp_session import free_port
from test_fsdp import REPO, load, max_difference

WORKLOAD = Path(__file__).with_name("anyresume_workload.py")
CONFIGS = [(strategy, world) for strategy in ("ddp", "fsdp") for world in (1, 2, 4)]


def launch(world: int, *args: str, workload: Path = WORKLOAD) -> None:
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{REPO}:{REPO / 'tests'}", "OMP_NUM_THREADS": "1",
               "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
               "HPC_WATCHDOG_S": "0"}
        procs.append(ranklaunch.popen([sys.executable, str(workload), *args], env=env,
                                      stderr=subprocess.PIPE, text=True))
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * world, "\n".join(errors)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    root = tmp_path_factory.mktemp("any")
    for world in (1, 2, 4):
        launch(world, "save", str(root))
    for world in (1, 2, 4):
        launch(world, "resume", str(root))
    return root


@pytest.mark.parametrize("source,target", list(itertools.product(CONFIGS, CONFIGS)),
                         ids=lambda c: f"{c[0]}{c[1]}")
def test_a_checkpoint_resumes_under_any_strategy_and_world_size(matrix, source, target):
    src = matrix / f"src-{source[0]}-{source[1]}"
    dst = matrix / f"dst-{source[0]}-{source[1]}-to-{target[0]}-{target[1]}"
    assert max_difference(load(dst / "loaded.pt"), load(src / "saved.pt")) == 0.0
    assert (dst / "checkpoints" / "step-3").is_dir()  # the step after the resume was trained and saved
