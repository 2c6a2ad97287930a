"""Submission on the real local cluster from an inherited environment: a shell inside an allocation
(salloc, or a job that submits the next stage) carries SLURM_* and SBATCH_* variables that must not
become the new job's.

    HPC_TEST_CLUSTER_DIR=/tmp/c python -m pytest tests/slurm/test_submit_cluster.py -m slurm
"""
import json
import sys

import pytest

from hpc import submit
from hpc.rundir.run import RunDir
from tests.slurm.test_pipeline import ended, job_ids, wait_until

pytestmark = pytest.mark.slurm

DUMP = """\
import json, os, pathlib
out = pathlib.Path(os.environ["HPC_CHECKPOINT_DIR"]) / f"env-{os.environ['SLURM_PROCID']}.json"
out.write_text(json.dumps(dict(os.environ)))
"""
# What an salloc shell (or a running job) would hand down, plus sbatch input variables.
INHERITED = {"SLURM_JOB_ID": "999", "SLURM_JOBID": "999", "SLURM_NTASKS": "7", "SLURM_PROCID": "3",
             "SLURM_NNODES": "5", "SLURM_NODELIST": "n[1-5]", "SLURM_CPUS_PER_TASK": "3", "SLURM_HPC_TEST_MARK": "1",
             "SBATCH_PARTITION": "high", "SBATCH_EXCLUSIVE": "user", "RANK": "5", "WORLD_SIZE": "9"}


def test_a_job_submitted_from_inside_an_allocation_runs_with_its_own_values(slurm_cluster, tmp_path, monkeypatch):
    for name, value in INHERITED.items():
        monkeypatch.setenv(name, value)
    script = tmp_path / "dump.py"
    script.write_text(DUMP)
    run_dir = tmp_path / "run"
    assert submit.main(["run", "--cluster", "slurm", "--run-dir", str(run_dir), "--nodes", "1", "--gpus-per-node", "2",
                        "stages.main.cpus_per_task=1", "--", sys.executable, str(script)]) == 0
    run = RunDir(run_dir)
    records = wait_until(lambda: ended(run), what="the job to end")
    job_id = job_ids(run)[("main", None)]
    assert records[job_id].state == "COMPLETED", records
    seen = [json.loads((run_dir / "main" / "checkpoints" / f"env-{r}.json").read_text()) for r in (0, 1)]
    for rank, env in enumerate(seen):
        assert env["SLURM_JOB_ID"] == job_id and env["SLURM_PROCID"] == str(rank)
        assert env["SLURM_NTASKS"] == "2" and env["SLURM_NNODES"] == "1" and env["SLURM_CPUS_PER_TASK"] == "1"
        assert env["SLURM_JOB_PARTITION"] == "low"  # the default partition, not SBATCH_PARTITION's
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "2"
        assert "SLURM_HPC_TEST_MARK" not in env and not [k for k in env if k.startswith("SBATCH_")]
