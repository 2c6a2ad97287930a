"""What SLURM's tasks really see, parsed by hpc.runtime.envparse on the real local cluster.

    python -m pytest tests/slurm/test_env_cluster.py -m slurm
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from hpc.runtime.distenv import master_port_for
from tests.slurm.test_ddp import TWO_BY_TWO, job_log, submit, wait_end

pytestmark = pytest.mark.slurm

# What a login shell may hold after a torchrun session: sbatch exports it into every task.
LOGIN_SHELL = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "login", "MASTER_PORT": "29500"}


def report_per_task(out) -> str:
    """A step where every task records the variables it inherited and what hpc.runtime.envparse parses."""
    task = (f'echo "$RANK $WORLD_SIZE $MASTER_ADDR $MASTER_PORT" > {out}/seen-$SLURM_PROCID; '
            f"{sys.executable} -m hpc.env --json > {out}/env-$SLURM_PROCID.json")
    return f"srun bash -c '{task}'"


def test_inherited_torchrun_variables_do_not_beat_slurms(slurm_cluster, tmp_path, monkeypatch):
    for name, value in LOGIN_SHELL.items():
        monkeypatch.setenv(name, value)
    job = submit(tmp_path, *TWO_BY_TWO, command=report_per_task(tmp_path))
    state, _ = wait_end(job)
    assert state == "COMPLETED", job_log(tmp_path, job)
    seen = {tuple((tmp_path / f"seen-{r}").read_text().split()[:2]) for r in range(4)}
    assert seen == {("0", "1")}  # the tasks did inherit the login shell's RANK and WORLD_SIZE
    rows = [json.loads((tmp_path / f"env-{r}.json").read_text()) for r in range(4)]
    assert [(r["source"], r["rank"], r["world_size"], r["local_rank"]) for r in rows] == [
        ("slurm", rank, 4, rank % 2) for rank in range(4)]
    assert {(r["master_addr"], r["master_port"]) for r in rows} == {("n1", master_port_for(job))}


def test_array_tasks_get_their_own_port(slurm_cluster, tmp_path):
    out = tmp_path
    command = f"srun {sys.executable} -m hpc.env --json > {out}/env-$SLURM_ARRAY_TASK_ID.json"
    array = submit(out, "--array=0-3", "--ntasks=1", command=command)
    tasks = [f"{array}_{t}" for t in range(4)]
    for task in tasks:
        state, _ = wait_end(task)
        assert state == "COMPLETED", os.listdir(out)
    rows = [json.loads((out / f"env-{t}.json").read_text()) for t in range(4)]
    assert {r["array_job_id"] for r in rows} == {array}
    assert [r["array_task_id"] for r in rows] == [0, 1, 2, 3]
    assert len({r["job_id"] for r in rows}) == 4  # SLURM gives every array task its own id
    assert all(r["master_port"] == master_port_for(r["job_id"]) for r in rows)
    assert len({r["master_port"] for r in rows}) == 4
