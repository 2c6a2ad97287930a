"""DDP from SLURM's variables on the real local cluster: 2 nodes x 2 tasks, gres gpu:2 per node.

    python -m pytest tests/slurm/test_ddp.py -m slurm

The fake GPUs are character devices, not CUDA: every task gets CUDA_VISIBLE_DEVICES from
SLURM, passes the device-binding checks, and then trains on the CPU with gloo.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slurm

WORKLOAD = Path(__file__).parent.parent / "ddp_workload.py"
TWO_BY_TWO = ("--nodes=2", "--ntasks-per-node=2", "--gres=gpu:2")
ONE_A_NODE = ("--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1")  # across nodes, half the processes


def job_state(job_id: str) -> tuple[str, str]:
    """(JobState, ExitCode) as scontrol reports them."""
    line = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                          text=True, check=True).stdout
    fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
    return fields["JobState"], fields["ExitCode"]


def submit(out: Path, *options: str, command: str) -> str:
    out.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        ["sbatch", "--parsable", f"--output={out}/slurm-%j.out", *options, "--wrap", command],
        capture_output=True, text=True, check=True).stdout.strip().split(";")[0]


def wait_end(job_id: str, timeout: float = 180) -> tuple[str, float]:
    # Polled here: `sbatch --wait` backs off to half-minute polls and would blur the timings.
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        state, _ = job_state(job_id)
        if state not in {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING"}:
            return state, time.monotonic() - started
        time.sleep(0.25)
    raise AssertionError(f"job {job_id} still {state} after {timeout} s")


def sbatch_wait(out: Path, *options: str, command: str, timeout: float = 180):
    """Submit, wait for the end; return (job id, final state, seconds from submission)."""
    job_id = submit(out, *options, command=command)
    state, elapsed = wait_end(job_id, timeout)
    return job_id, state, elapsed


def job_log(out: Path, job_id: str) -> str:
    return (out / f"slurm-{job_id}.out").read_text()


def rank_results(out: Path, world: int) -> list[dict]:
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(world)]


def workload(name: str, out: Path, *args: str) -> str:
    return f"{sys.executable} {WORKLOAD} {name} {out} {' '.join(args)}"


def test_two_nodes_two_tasks_agree_on_all_reduce(slurm_cluster, tmp_path):
    job, state, _ = sbatch_wait(tmp_path, *TWO_BY_TWO, command="srun " + workload("allreduce", tmp_path))
    assert state == "COMPLETED", job_log(tmp_path, job)
    rows = rank_results(tmp_path, 4)
    assert [r["sum"] for r in rows] == [10.0] * 4 and all(r["mean"] == [1.5, 1.0] for r in rows)
    assert [(r["host"], r["local_rank"]) for r in rows] == [("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1)]
    assert {r["source"] for r in rows} == {"slurm"} and len({r["master"] for r in rows}) == 1
    assert rows[0]["master"].startswith("n1:")


def test_accumulation_equals_more_devices(slurm_cluster, tmp_path):
    """world 2 (a task on each of 2 nodes) x accum 2 == world 1 x accum 4 on the same global batch,
    each session made from SLURM's variables. World 4 is tests/test_ddp_session.py's (1, 2 and 4
    local ranks); a 2 x 2 session from SLURM's variables is test_two_nodes_two_tasks_agree_on_all_reduce's."""
    layouts = {2: ("--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1"), 1: ("--nodes=1", "--ntasks=1", "--gres=gpu:1")}
    # Submit both at once: they fit side by side on the two nodes.
    jobs = {}
    for world, options in layouts.items():
        out = tmp_path / f"world{world}"
        cmd = "srun " + workload("train", out, "--global-batch", "16", "--per-device-max", "4")
        jobs[world] = submit(out, *options, command=cmd)
    for world, job in jobs.items():
        state, _ = wait_end(job, timeout=240)
        assert state == "COMPLETED", job_log(tmp_path / f"world{world}", job)
    weights = {w: torch.load(tmp_path / f"world{w}/weights.pt", weights_only=True) for w in layouts}
    assert rank_results(tmp_path / "world2", 2)[0]["accum_steps"] == 2
    for name, tensor in weights[1].items():
        diff = (tensor - weights[2][name]).abs().max().item()
        assert diff < 1e-6, (name, diff)


def leftovers(marker: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if marker in line and "ps -eo" not in line]


def test_raising_rank_fails_the_job_within_timeout(slurm_cluster, tmp_path):
    job, state, elapsed = sbatch_wait(tmp_path, *ONE_A_NODE,
                                      command="srun " + workload("fail", tmp_path, "--timeout", "20"))
    log = job_log(tmp_path, job)
    assert state == "FAILED" and "rank 1 fails on purpose" in log
    assert elapsed < 20 + 20, elapsed
    assert not leftovers(str(tmp_path))


def test_hung_rank_ends_with_the_timeout_under_kill_on_bad_exit(slurm_cluster, tmp_path):
    # Rank 1 (on the second node) sleeps without dying; rank 0 gives up after the session timeout
    # (8 s) and exits non-zero; srun --kill-on-bad-exit then ends the sleeper too.
    cmd = "srun --kill-on-bad-exit=1 " + workload("hang", tmp_path, "--timeout", "8")
    job, state, elapsed = sbatch_wait(tmp_path, *ONE_A_NODE, command=cmd)
    assert state == "FAILED", job_log(tmp_path, job)
    waited = [float((tmp_path / f"rank-{r}.elapsed").read_text()) for r in (0,)]
    assert all(7 < w < 30 for w in waited), waited
    assert elapsed < 8 * 10, elapsed  # well before the sleeper would have woken up
    assert not leftovers(str(tmp_path))


TORCHRUN_SCRIPT = """\
import os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")  # env:// : reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
t = torch.tensor([float(os.environ["RANK"])])
dist.all_reduce(t)
print("RESULT", os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"],
      os.environ["LOCAL_WORLD_SIZE"], int(t.item()), sys.argv[1], flush=True)
dist.destroy_process_group()
"""


def test_torchrun_style_script_runs_unchanged(slurm_cluster, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_SCRIPT)
    cmd = f"srun {sys.executable} -m hpc.launch -- {sys.executable} {script} --lr=1e-3"
    job, state, _ = sbatch_wait(tmp_path, *TWO_BY_TWO, command=cmd)
    log = job_log(tmp_path, job)
    assert state == "COMPLETED", log
    rows = sorted(line.split()[1:] for line in log.splitlines() if line.startswith("RESULT"))
    assert rows == [[str(r), str(r % 2), "4", "2", "6", "--lr=1e-3"] for r in range(4)]


def _submitit_task() -> dict:
    """Runs in every task of a submitit job: the path the pipeline's stages take."""
    import hpc.ddp

    with hpc.ddp.session(timeout_s=60) as s:
        model = s.wrap(torch.nn.Linear(2, 1))
        return {"rank": s.rank, "sum": s.all_reduce_sum(float(s.rank)),
                "ddp": type(model).__name__, "plan": s.plan_batch(8, 2).accum_steps}


def test_submitit_tasks_open_a_session(slurm_cluster, tmp_path):
    import cloudpickle
    import submitit

    # The job imports this function by value: tests/slurm is not on the job's sys.path.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        executor = submitit.SlurmExecutor(folder=tmp_path)
        executor.update_parameters(nodes=2, ntasks_per_node=2, gres="gpu:2", time=5)
        job = executor.submit(_submitit_task)
        rows = job.results()
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert [r["rank"] for r in rows] == [0, 1, 2, 3]
    assert all(r["sum"] == 6.0 and r["ddp"] == "DistributedDataParallel" for r in rows)
    assert {r["plan"] for r in rows} == {1}  # global 8, max 2 per device, 4 devices: no accumulation
