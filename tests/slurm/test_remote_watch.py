"""From the laptop, through the real sshd (tests/sshd.py), on the sandbox cluster: a running task's log
followed until its job ends, the connection killed mid-push of a whole submission, and a run preempted
on the cluster that resumes, watched with hpc.status and hpc.Run.attach from the laptop.

    python -m pytest tests/slurm/test_remote_watch.py -m slurm
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import time
from pathlib import Path

import pytest

from hpc.cluster.preempt import preempt
from hpc.rundir.run import RunDir
from tests.slurm.test_pipeline import RESUMABLE, wait_until
from tests.slurm.test_remote import Laptop, drop
from tests.sshd import sshd  # noqa: F401 - fixture

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def laptop(sshd, slurm_cluster, tmp_path_factory):  # noqa: F811
    where = tmp_path_factory.mktemp("laptop")
    setup = " && ".join(f"export {k}={shlex.quote(v)}" for k, v in slurm_cluster.env().items())
    return Laptop(where, {"a": sshd.entry(runs=str(where / "runs"), setup=setup, partition="low")})


def test_logs_follow_a_running_task_from_the_laptop_and_end_when_it_ends(laptop):
    address = laptop.submit("a", "tiny.parts=[0]", "tiny.sleep_s=6")
    log = laptop.popen("-m", "hpc.logs", address, "--stage", "first", "-f")
    try:
        first = log.stdout.readline()  # what the task printed as it started: followed while it runs
        run = RunDir(address.partition(":")[2])
        assert first and not run.is_done("first"), first
        rest, err = log.communicate(timeout=90)  # ends on its own once the job has ended
    finally:
        log.kill()
    assert log.returncode == 0 and "stage first item None rank 0 finished" in first + rest, first + rest + err
    assert run.is_done("first") and err == "", err


def test_a_connection_killed_mid_push_is_one_line_leaves_nothing_and_the_retry_submits_once(laptop):
    data = laptop.proj / "data"  # 64 MB of code to push, in files small enough to be code (codefiles)
    data.mkdir()
    for n in range(32):
        (data / f"{n}.bin").write_bytes(os.urandom(2 << 20))
    runs, store = laptop.proj.parent / "runs", laptop.proj.parent / "runs" / ".hpc-code"

    def made() -> set:  # run directories, snapshots and code trees there
        return {str(p.relative_to(runs)) for p in [*runs.glob("*"), *store.glob("trees/*")] if p != store}
    before = made()
    try:
        pushing = laptop.popen("-m", "hpc.submit", "mypkg.tiny", "--cluster", "a", "tiny.parts=[0]")
        while not any(store.rglob(".tmp-*")) and pushing.poll() is None:  # the big object is on its way
            time.sleep(0.02)
        drop(laptop)  # the network drops mid-push
        out, err = pushing.communicate(timeout=60)
        assert pushing.returncode == 2 and "Traceback" not in err, out + err
        line, = [x for x in err.splitlines() if x.startswith("error:")]
        assert line.startswith("error: pushing the code on cluster a") and "the connection dropped" in line, err
        assert re.search(r"HINT: try ssh -p \d+ .*\S+@127\.0\.0\.1 true$", line), line
        wait_until(lambda: not any(store.rglob(".tmp-*")), 30, what="the cut push's temporary to go")
        assert made() == before  # no code tree a job would run, no run directory, no snapshot
        assert sum(p.stat().st_size == 2 << 20 for p in store.glob("objects/*/*")) < 32  # cut before the last

        address = laptop.submit("a", "tiny.parts=[0]")  # the same command again: pushes, submits once
        new = {name for name in made() - before if not name.startswith(".")}
        assert new == {Path(address.partition(":")[2]).name}, new
        tasks = RunDir(address.partition(":")[2]).tasks()
        assert sorted(t["stage"] for t in tasks) == ["first", "second"] and all(len(t["jobs"]) == 1 for t in tasks)
        assert [r["state"] for r in laptop.wait(address)] == ["COMPLETED", "COMPLETED"]
    finally:
        shutil.rmtree(data)


def test_a_run_preempted_on_the_cluster_resumes_watched_from_the_laptop(laptop, slurm_cluster):
    (laptop.proj / "resumable.py").write_text(RESUMABLE)
    address = laptop.submit("a", "--nodes", "1", "--gpus-per-node", "1", "stages.main.cpus_per_task=1",
                            "--", sys.executable, "resumable.py", "24", pipeline="run")  # the script is pushed
    run = RunDir(address.partition(":")[2])
    job = run.tasks()[0]["job_id"]
    ckpt = run.path / "main" / "checkpoints" / "step-rank0"
    wait_until(lambda: ckpt.exists() and int(ckpt.read_text() or 0) >= 3, what="the script to make progress")
    preempt(slurm_cluster, job)
    rows = laptop.wait(address)
    assert [(r["state"], r["restarts"] >= 1) for r in rows] == [("COMPLETED", True)], rows
    table = laptop.run("-m", "hpc.status", address)
    assert table.returncode == 0 and "COMPLETED" in table.stdout, table.stdout + table.stderr
    log = laptop.run("-m", "hpc.logs", address).stdout
    resumed = [int(x) for x in re.findall(r"^resumed from step (\d+)", log, re.M)]
    assert resumed[0] == 0 and resumed[-1] >= 3 and "finished at step 24" in log, log

