"""A sweep of one-GPU points packed on the real local SLURM cluster: 4 points, 2 per job, run as
2 jobs (one array of 2 tasks), each point as its own srun step with its own GPU, its own done marker
and log, which python -m hpc.logs on the point prints; python -m hpc.status shows each point with the job it shared.

    python -m pytest tests/slurm/test_packing_sweep.py -m slurm
"""
import re
import sys

import pytest

from hpc import logs as hpc_logs
from hpc import submit
from hpc.monitor import status
from hpc.rundir.sweepdir import SweepDir
from hpc.slurm import scheduler
from tests.slurm.requeue_helpers import wait_for

pytestmark = pytest.mark.slurm

POINT = ("import os, sys\n"
         "print('point X=' + os.environ['X'] + ' CUDA_VISIBLE_DEVICES=' + os.environ.get('CUDA_VISIBLE_DEVICES', '?'),"
         " flush=True)\n"
         "sys.exit(3 if os.environ['X'] == os.environ['FAIL_X'] else 0)\n")


def jobs_of(sweep):
    return {sig: next(t["job_id"] for t in sweep.point(sig).tasks()) for sig in sweep.record()["points"]}


def ended(sweep):
    ids = set(jobs_of(sweep).values())
    records = scheduler.query(ids)
    return records if set(records) == ids and all(r.state not in scheduler.ACTIVE for r in records.values()) else None


def test_a_sweep_of_four_one_gpu_points_packed_two_per_job_runs_as_two_jobs(slurm_cluster, tmp_path, capsys):
    assert slurm_cluster.layout.gpus_per_node >= 2
    (tmp_path / "point.py").write_text(POINT)
    sweep = SweepDir(tmp_path / "s")
    args = ["run", "--cluster", "slurm", "--run-dir", str(sweep.path), "--no-snapshot", "--nodes", "1",
            "--gpus-per-node", "1", "stages.main.cpus_per_task=1", "--pack", "2",
            "--", sys.executable, str(tmp_path / "point.py")]
    assert submit.main([*args[:-3], "script.env.FAIL_X=2", "--sweep", "script.env.X=1,2,3,4", *args[-3:]]) == 0
    wait_for(lambda: ended(sweep), "the packed points' jobs to end")
    by_x = {entry["overrides"]["script.env.X"]: sig for sig, entry in sweep.record()["points"].items()}
    jobs = jobs_of(sweep)
    assert len(set(jobs.values())) == 2 and len({j.split("_")[0] for j in jobs.values()}) == 1  # 2 jobs, one array
    done = {x: sweep.point(sig).is_done("main", None) for x, sig in by_x.items()}
    assert done == {1: True, 2: False, 3: True, 4: True}  # the failed point left its sibling running
    for x, sig in by_x.items():  # each point its own step, GPU and log
        rows = status.collect(sweep.point(sig))
        assert [r.job_id for r in rows] == [jobs[sig]] and rows[0].state == ("FAILED" if x == 2 else "COMPLETED")
    shared = [sig for sig in by_x.values() if jobs[sig] == jobs[by_x[1]]]
    logs = sweep.path / "main" / "logs" / jobs[by_x[1]].split("_")[0]
    devices = set()
    for sig in shared:
        text = (logs / f"{jobs[sig]}.item-{sig}_0_log.out").read_text()
        devices.add(re.search(r"point X=\d CUDA_VISIBLE_DEVICES=(\S*)", text).group(1))
    assert len(devices) == 2 and all(d.isdigit() for d in devices), devices  # one GPU each
    capsys.readouterr()
    assert hpc_logs.main([str(sweep.path / by_x[3])]) == 0  # python -m hpc.logs POINT: the point's own log
    printed = capsys.readouterr().out
    assert f"{jobs[by_x[3]]}.item-{by_x[3]}_0_log.out <==" in printed and "point X=3 " in printed
    # a resubmission runs only the failed point, packed again: one job of one point
    assert submit.main([*args[:-3], "script.env.FAIL_X=0", *args[-3:]]) == 0
    wait_for(lambda: ended(sweep), "the resubmitted point to end")
    assert all(sweep.point(sig).is_done("main", None) for sig in by_x.values())
    again = jobs_of(sweep)
    assert again[by_x[2]] not in jobs.values() and {x: again[s] for x, s in by_x.items() if x != 2} == \
        {x: jobs[s] for x, s in by_x.items() if x != 2}
