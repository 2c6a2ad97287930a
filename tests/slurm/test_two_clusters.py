"""Two sandbox clusters on one host, each started as a user starts one (`python -m hpc.cluster up`),
run a 2-rank job at the same time: their jobs' MASTER_PORTs, derived from job ids, must differ.

    python -m pytest tests/slurm/test_two_clusters.py -m slurm
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

# Both ranks hold the group for a few seconds after the rendezvous, so the two jobs overlap.
GLOO_JOB = """\
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
time.sleep(4)
dist.barrier()
print("sum", int(t.item()), "port", os.environ["MASTER_PORT"], "job", os.environ["SLURM_JOB_ID"], flush=True)
dist.destroy_process_group()
"""


def cluster_cli(directory: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpc.cluster", *args, "--dir", str(directory)],
                          capture_output=True, text=True, timeout=300)


def test_two_clusters_on_one_host_run_a_two_rank_job_each_at_once(tmp_path):
    script = tmp_path / "gloo_job.py"
    script.write_text(GLOO_JOB)
    dirs = [Path(tempfile.mkdtemp(prefix=f"hpc-test-two-{k}-")) for k in "ab"]
    try:
        envs = []
        for d in dirs:
            up = cluster_cli(d, "up", "--nodes", "1", "--gpus-per-node", "0", "--cpus-per-node", "2",
                             "--no-accounting")
            assert up.returncode == 0, up.stdout + up.stderr
            shell = cluster_cli(d, "env").stdout  # export NAME=VALUE lines
            env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
            for line in shell.splitlines():
                name, _, value = line.removeprefix("export ").partition("=")
                env[name] = value.strip("'\"")
            envs.append(env)
        jobs = [subprocess.Popen(["srun", "--nodes=1", "--ntasks=2", "--cpus-per-task=1", "--time=2",
                                  sys.executable, "-m", "hpc.launch", "--", sys.executable, str(script)],
                                 env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for env in envs]
        results = [job.communicate(timeout=180) for job in jobs]
        for job, (out, err) in zip(jobs, results):
            assert job.returncode == 0, err[-2000:]
            assert out.count("sum 3") == 2, out + err[-2000:]
        ports = [{line.split()[3] for line in out.splitlines() if line.startswith("sum")} for out, _ in results]
        assert len(ports[0] | ports[1]) == 2, ports  # one port per job, none shared
    finally:
        for d in dirs:
            cluster_cli(d, "down")
            subprocess.run(["rm", "-rf", str(d)])
