"""The hang watchdog of an unmodified script under `python -m hpc.submit run`, on the real local
cluster: rank 1 stops answering while rank 0 waits for it in an all-reduce, so rank 0's output stops.
hpc takes every rank's stacks, names rank 1 and its host, and requeues the job, which then finishes.

    python -m pytest tests/slurm/test_run_hang.py -m slurm
"""

from __future__ import annotations

import json
import shutil
import sys
import time

import pytest

from hpc import status, submit
from hpc.cluster.preempt import job_field, release_hold
from hpc.rundir.run import RunDir
from tests.slurm.requeue_helpers import wait_for

pytestmark = pytest.mark.slurm

HANGING = """\
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, restart = dist.get_rank(), os.environ.get("SLURM_RESTART_COUNT", "0")

def stuck_reading_a_file():
    time.sleep(600)

t = torch.zeros(1)
for step in range(30):
    time.sleep(0.2)
    if restart == "0" and step == 10 and rank == 1:
        stuck_reading_a_file()
    dist.all_reduce(t)
    if rank == 0:
        print("step", step, flush=True)
dist.destroy_process_group()
"""


def test_a_hung_script_is_named_by_its_stacks_and_requeued(slurm_cluster, tmp_path, monkeypatch, capsys):
    if shutil.which("py-spy") is None:
        pytest.skip("py-spy is not installed (the test extra installs it): the stuck rank is told by its stacks")
    script = tmp_path / "hanging.py"
    script.write_text(HANGING)
    run_dir = tmp_path / "run"
    monkeypatch.chdir(tmp_path)
    assert submit.main(["run", "--cluster", "slurm", "--run-dir", str(run_dir), "--tasks-per-node", "2",
                        "--hang-after", "6", "stages.main.cpus_per_task=1",
                        "stages.main.max_restarts_in_place=0", "--", sys.executable,  # the requeue, not a restart in place
                        str(script)]) == 0
    job = RunDir(run_dir).tasks()[0]["job_id"]
    reports = run_dir / "main" / "hangs"
    wait_for(lambda: list(reports.glob("*/report.json")), "the hang report", timeout=180)
    report = json.loads(next(reports.glob("*/report.json")).read_text())
    assert report["stuck"] == [1] and report["hosts"]["1"], report
    assert report["decision"]["requeue"] is True, report
    stacks = (next(reports.glob("*/rank-1.txt"))).read_text()
    assert "stuck_reading_a_file" in stacks
    assert "all_reduce" in (next(reports.glob("*/rank-0.txt"))).read_text()
    wait_for(lambda: int(job_field(slurm_cluster, job, "Restarts") or 0) == 1, "the requeue", timeout=120)
    release_hold(slurm_cluster, job, time.monotonic() + 60)
    wait_for(lambda: job_field(slurm_cluster, job, "JobState") == "COMPLETED", "the second attempt", timeout=180)
    capsys.readouterr()
    status.main([str(run_dir)])
    assert "main hang: rank 1 on" in capsys.readouterr().out
