"""`--cluster here` on the real local SLURM cluster, typed in a real salloc shell: every variable salloc
exports is in the command's environment, as a user has it (salloc_shell).

LangSplat's sandbox run as srun steps of one `salloc -N 2 --ntasks-per-node=2 --gres=gpu:2`, the
allocation of the docs, interrupted with Ctrl-C (SIGINT) mid-features and run again, every rank in the
container stand-in of tests/box.py (the `exec` runtime under bubblewrap: no SLURM client, and no hpc
but the copy hpc carries in), so the same run shows that a stage in a container stops and resumes in
an allocation; and a step gets its stage's ranks and GPUs whatever the allocation's shape.
python -m pytest tests/slurm/test_here.py -m slurm
"""
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

import hpc
from hpc.rundir.run import RunDir
from tests.box import boxed
from tests.slurm.test_langsplat import LEVEL, MINI
from tests.slurm.test_pipeline import wait_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slurm
# features long enough (on 4 ranks) that the Ctrl-C lands between its first checkpoint and its end
TRAINER = {**MINI, "feature_iterations": 400, "checkpoint_every": 50, "log_every": 50}
# what each rank of a script run writes: its environment, in a file named after its rank
DUMP = "import json, os, sys; open(f'{sys.argv[1]}/rank-{os.environ[\"RANK\"]}.json', 'w').write(json.dumps(dict(os.environ)))"


@contextlib.contextmanager
def salloc_shell(tmp_path: Path, *options: str) -> Iterator[Dict[str, str]]:
    """The environment of the shell that `salloc OPTIONS` opens (all it exports: SLURM_JOB_ID,
    SLURM_NTASKS, SLURM_GPUS_PER_NODE, ...): a command run with it is one typed in that shell. The
    shell exits at the end of the block, and with it the allocation."""
    env_file, end = tmp_path / "salloc.env", tmp_path / "salloc.end"
    shell = f"env -0 > {env_file}.tmp && mv {env_file}.tmp {env_file}; while [ ! -e {end} ]; do sleep 0.2; done"
    holder = subprocess.Popen(["salloc", *options, "-J", "hpc-here-test", "bash", "-c", shell],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_until(lambda: env_file.exists() or holder.poll() is not None, what="the salloc shell")
        assert env_file.exists(), holder.communicate()[1]
        yield dict(v.split("=", 1) for v in env_file.read_text().split("\0") if "=" in v)
    finally:
        end.touch()
        try:
            holder.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(holder.pid, signal.SIGKILL)


def script_run(run_dir: Path, code: str, *options: str) -> List[str]:
    """`python -m hpc.submit run --cluster here` of a one-rank, no-GPU script (`python -c code`)."""
    return [sys.executable, "-m", "hpc.submit", "run", "--cluster", "here", "--run-dir", str(run_dir),
            "--gpus-per-node", "0", "stages.main.cpus_per_task=1", *options, "--", sys.executable, "-c", code]


def test_a_step_gets_its_stage_s_ranks_and_gpus_whatever_the_allocation_says(slurm_cluster, tmp_path):
    """salloc exports SLURM_NTASKS=2, SLURM_GPUS_PER_NODE=2, SLURM_MEM_PER_NODE, which srun takes as every
    step's options: a 1-task stage ran as 2 ranks, a CPU stage saw both GPUs."""
    with salloc_shell(tmp_path, "-N", "1", "--ntasks-per-node=2", "--gpus-per-node=2", "--mem=1000", "-t", "10") as env:
        assert env["SLURM_NTASKS"] == "2" and env["SLURM_GPUS_PER_NODE"] == "2"
        for name, gpus in (("cpu", "0"), ("gpu", "1")):
            (tmp_path / name).mkdir()
            done = subprocess.run(script_run(tmp_path / f"run-{name}", DUMP, "--gpus-per-node", gpus) + [
                str(tmp_path / name)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
            assert done.returncode == 0, done.stdout + done.stderr
    ranks = {name: sorted(p.name for p in (tmp_path / name).iterdir()) for name in ("cpu", "gpu")}
    assert ranks == {"cpu": ["rank-0.json"], "gpu": ["rank-0.json"]}
    cpu, gpu = (json.loads((tmp_path / name / "rank-0.json").read_text()) for name in ("cpu", "gpu"))
    for seen in (cpu, gpu):
        assert seen["WORLD_SIZE"] == seen["SLURM_STEP_NUM_TASKS"] == seen["SLURM_NTASKS"] == "1", seen
    assert not cpu.get("CUDA_VISIBLE_DEVICES") and not cpu.get("SLURM_STEP_GPUS"), cpu
    assert len(gpu["CUDA_VISIBLE_DEVICES"].split(",")) == 1, gpu


def test_langsplat_in_an_allocation_stops_on_ctrl_c_and_resumes(slurm_cluster, tmp_path):
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 1))
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "hpc.submit", "langsplat", "--profile", "sandbox", "--levels", str(LEVEL),
               "--cluster", "here", "--run-dir", str(run_dir),
               *(f"langsplat.trainer.{k}={v}" for k, v in TRAINER.items()), *boxed()]
    with salloc_shell(tmp_path, "-N", "2", "--ntasks-per-node=2", "--gres=gpu:2", "-t", "10") as env:
        job = env["SLURM_JOB_ID"]
        # its own process group, as a terminal's foreground job: Ctrl-C reaches it and nothing else
        first = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, start_new_session=True)
        checkpoints = run_dir / "features" / f"task-{LEVEL}" / "checkpoints"
        wait_until(lambda: list(checkpoints.glob("step-*/")) or first.poll() is not None, timeout_s=240,
                   what="a first feature checkpoint")
        assert first.poll() is None, first.communicate()[0]  # still running: the steps were created
        os.killpg(first.pid, signal.SIGINT)  # what Ctrl-C in the salloc shell sends
        said = first.communicate(timeout=180)[0]
        assert first.returncode == 130, said
        assert "interrupted: the stopped tasks saved their checkpoints" in said and "stage rgb: done" in said
        steps = [line for line in said.splitlines() if re.match(r"\s+note: stage (rgb|features#?\d*): ", line)]
        assert len(steps) == 2 and all(" bwrap --die-with-parent " in t and "/carry/" in t for t in steps), said
        assert "hpc for the containers: " in said  # boxed, with hpc carried in
        run = RunDir(run_dir)
        assert run.is_done("rgb") and not run.is_done("features", LEVEL)
        stopped = hpc.Run.attach(run_dir).status()
        assert {r["task"]: r["state"] for r in stopped} == {"rgb": "COMPLETED", f"features[{LEVEL}]": "FAILED"}
        assert "stopped by Ctrl-C (--cluster here)" in next(r for r in stopped if r["stage"] == "features")["error"]

        second = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stdout + second.stderr
        assert "skip rgb: done marker present" in second.stdout and "stage rgb:" not in second.stdout.split("plan")[-1]
        metrics = json.loads((run.task_dir("features", LEVEL) / "metrics.json").read_text())
        assert 0 < metrics["resumed_from"] < TRAINER["feature_iterations"], metrics
        assert metrics["world_size"] == 4
        rows = hpc.Run.attach(run_dir).status()
        assert {r["task"]: r["state"] for r in rows} == {"rgb": "COMPLETED", f"features[{LEVEL}]": "COMPLETED"}
        assert rows[0]["world_size"] == 1  # rgb: one rank, in an allocation of four tasks
        tasks = {t["stage"]: [j["job_id"] for j in t["jobs"]] for t in run.tasks()}
        assert tasks == {"rgb": [f"{job}.h1"], "features": [f"{job}.h2", f"{job}.h3"]}

    # no sbatch: the allocation is the only job since the test began, and its steps are the tasks
    def steps():
        out = subprocess.run(["sacct", "-n", "-P", "-j", job, "-o", "JobID,JobName"], capture_output=True,
                             text=True, check=True).stdout
        return sorted(re.sub(r"\.run-\w+\.", ".", line.split("|")[1]) for line in out.splitlines()
                      if re.match(rf"{job}\.\d+\|", line))
    assert wait_until(lambda: len(steps()) == 3 and steps(), what="sacct to list the steps") == [
        "hpc-features.h2", "hpc-features.h3", "hpc-rgb.h1"]
    # sacct -S also lists an earlier test's job that was still ending then: only those submitted since count
    listed = subprocess.run(["sacct", "-n", "-P", "-X", "-a", "-S", since, "-o", "JobID,Submit"],
                            capture_output=True, text=True, check=True).stdout.split()
    jobs = [jid for jid, submitted in (row.split("|") for row in listed) if submitted >= since]
    assert jobs == [job]
