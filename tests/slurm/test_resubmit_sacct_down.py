"""A resubmission while sacct fails (slurmdbd down) neither queues a running task again nor reruns a
completed one, and submits nothing when squeue cannot answer either: the real clients wrapped by
faults.slurmshim, on the session cluster (with accounting).

    python -m pytest tests/slurm/test_resubmit_sacct_down.py
"""
import time

import pytest

from faults.slurmshim import DBD_DOWN, TIMEOUT, SlurmShim
from hpc.rundir.run import RunDir
from hpc.slurm import scheduler
from tests.slurm.test_flaky_controller import _hpc
from tests.slurm.test_submit_once import queued_by

pytestmark = pytest.mark.slurm


def test_a_resubmission_while_sacct_fails_submits_only_the_failed_task(slurm_cluster, site_env, tmp_path):
    site_env(slurm_cluster)
    run_dir, release = tmp_path / "run", tmp_path / "release"
    # second[0] completes, second[1] fails, second[2] runs until `release` exists
    args = ["tiny", "--cluster", "slurm", "--run-dir", str(run_dir), "tiny.parts=[0,1,2]", "tiny.slow_items=[2]",
            f"tiny.release_file={release}"]
    try:
        out = _hpc("hpc.submit", *args, "tiny.fail_items=[1]", env=slurm_cluster.client_env())
        assert out.returncode == 0, out.stdout + out.stderr
        run = RunDir(run_dir)
        ids = {(t["stage"], t["item"]): t["job_id"] for t in run.tasks()}
        deadline, states = time.monotonic() + 180, {}
        while time.monotonic() < deadline and states != {"first": "COMPLETED", 0: "COMPLETED", 1: "FAILED",
                                                          2: "RUNNING"}:
            time.sleep(1)
            answer = scheduler.query(list(ids.values()))
            states = {k[1] if k[0] == "second" else k[0]: answer[j].state for k, j in ids.items() if j in answer}
        assert run.is_done("second", 0) and not run.is_done("second", 1), states

        # slurmdbd down and squeue not answering: the states cannot be known, so nothing is submitted
        blind = SlurmShim(tmp_path / "blind").rule("sacct", range(1, 99), DBD_DOWN).rule("squeue", range(1, 99),
                                                                                           TIMEOUT)
        out = _hpc("hpc.submit", *args, env={**blind.env(slurm_cluster.client_env()), "HPC_SLURM_RETRY_S": "1"})
        assert out.returncode == 2 and blind.calls("sbatch") == [], out.stdout + out.stderr
        assert "HINT: " in out.stderr and "Traceback" not in out.stderr, out.stderr
        assert {(t["stage"], t["item"]): t["job_id"] for t in RunDir(run_dir).tasks()} == ids

        # slurmdbd down, squeue answering: only the failed task is submitted again
        shim = SlurmShim(tmp_path / "shim").rule("sacct", range(1, 99), DBD_DOWN)
        out = _hpc("hpc.submit", *args, env=shim.env(slurm_cluster.client_env()))
        assert out.returncode == 0, out.stdout + out.stderr
        assert "[hpc] accounting unreachable" in out.stderr, out.stderr
        assert len(shim.calls("sbatch")) == 1, out.stdout
        now = {(t["stage"], t["item"]): t["job_id"] for t in RunDir(run_dir).tasks()}
        assert {k: v for k, v in now.items() if k != ("second", 1)} == {k: v for k, v in ids.items()
                                                                         if k != ("second", 1)}
        assert now[("second", 1)] != ids[("second", 1)]
        assert len(queued_by(tmp_path)) == 3, queued_by(tmp_path)  # first, the array, second[1] again
    finally:
        release.touch()
        scheduler.cancel(list(queued_by(tmp_path)))
