"""hpc on the kinds of SLURM site users have: configless, and without accounting.

    python -m pytest tests/slurm/test_site_variants.py

Each variant is one cluster for the session (tests/conftest.py). The job that runs into its time
limit is submitted first, so that the minute SLURM needs to end it overlaps the other tests.
"""
import io
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hpc.slurm import scheduler
from hpc import submit
from hpc.monitor import status, table
from hpc.rundir.run import RunDir
from tests.slurm.test_pipeline import wait_until
from tests.slurm.pipelines import use_pipelines

pytestmark = pytest.mark.slurm
# tqdm's redraws as a task writes them to its stderr log, then the task works until its time limit
TQDM_THEN_SLEEP = ("import sys, time; from tqdm import tqdm; bar = tqdm(total=300, file=sys.stderr, mininterval=0); "
                   "[bar.update(1) for _ in range(164)]; sys.stderr.flush(); time.sleep(300)")


tiny = use_pipelines(tiny="tests.tiny_pipeline")


def bare_run(path: Path) -> RunDir:
    """A run directory whose tasks are plain sbatch jobs, recorded as hpc.submit records its own."""
    path.mkdir(parents=True)
    (path / "manifest.json").write_text(json.dumps({"pipeline": "bare", "submissions": [], "tasks": {}}))
    return RunDir(path)


@pytest.fixture(scope="module")
def time_limited(configless_cluster, tmp_path_factory):
    """(run dir, job id): a 1-minute job (SLURM's shortest limit) that shows tqdm progress, then sleeps."""
    run = bare_run(tmp_path_factory.mktemp("timeout") / "run")
    logs = f"{run.path}/bare/logs/%j/%j_0_log"
    jid = configless_cluster.run(["sbatch", "--parsable", "--hold", "--time=1", f"--output={logs}.out",
                                  f"--error={logs}.err", "--wrap",
                                  f"{sys.executable} -c {json.dumps(TQDM_THEN_SLEEP)}"]).stdout.strip()
    (run.path / "bare" / "logs" / jid).mkdir(parents=True)  # SLURM does not create the log directory
    configless_cluster.run(["scontrol", "release", jid])
    run.record("bare", None, jid, "slurm")
    return run, jid


def test_configless_clients_find_the_controller_with_no_conf_file(configless_cluster, site_env, time_limited,
                                                                  tmp_path, capsys):
    site_env(configless_cluster)
    assert not Path("/etc/slurm/slurm.conf").exists(), "a system slurm.conf would answer instead"
    shell = subprocess.run([sys.executable, "-m", "hpc.cluster", "env", "--dir", str(configless_cluster.dir)],
                           capture_output=True, text=True, check=True).stdout
    assert "unset SLURM_CONF" in shell and f"SLURM_CONF_SERVER={configless_cluster.layout.conf_server}" in shell
    jid = subprocess.run(["sbatch", "--parsable", "--output=/dev/null", "--wrap", "true"], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert jid in subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], capture_output=True, text=True).stdout
    kind = scheduler.detect("auto")
    assert kind == "slurm", kind.why_not_slurm
    assert submit.main(["tiny", "--cluster", "auto", "--dry-run", "--run-dir", str(tmp_path / "run")]) == 0
    assert "(executor: slurm)" in capsys.readouterr().out


def test_without_accounting_status_reads_what_ended_jobs_left(no_accounting_cluster, site_env, tmp_path):
    site_env(no_accounting_cluster)
    sacct = subprocess.run(["sacct", "-X"], capture_output=True, text=True)
    assert sacct.returncode != 0 and "Slurm accounting storage is disabled" in sacct.stdout + sacct.stderr
    assert submit.main(["tiny", "--cluster", "slurm", "--run-dir", str(tmp_path / "run"),
                        "tiny.parts=[0,1]", "tiny.fail_items=[1]"]) == 0
    run = RunDir(tmp_path / "run")
    bare = no_accounting_cluster.run(["sbatch", "--parsable", "--output=/dev/null", "--wrap", "true"]).stdout.strip()
    run.record("bare", None, bare, "slurm")  # a job that leaves neither a done marker nor a result file

    result, out = [], io.StringIO()
    follower = threading.Thread(target=lambda: result.append(table.follow(run, interval_s=1, out=out)), daemon=True)
    follower.start()
    follower.join(timeout=180)
    assert not follower.is_alive(), f"--wait never returned:\n{out.getvalue()}"
    assert result == [1]  # one task failed, one ended unknown

    ids = [t["job_id"] for t in run.tasks()]
    wait_until(lambda: not scheduler.query(ids), 90, "slurmctld to forget the ended jobs (MinJobAge)")
    rows = {r.task: r for r in status.collect(run)}
    assert {k: r.state for k, r in rows.items()} == {
        "first": "COMPLETED", "second[0]": "COMPLETED", "second[1]": "FAILED", "bare": status.ENDED}
    assert "failing on request" in rows["second[1]"].why
    assert "no accounting" in rows["bare"].why
    assert table.follow(run, interval_s=1, out=io.StringIO()) == 1  # returns at once, and says not all went well


def test_a_job_killed_at_its_time_limit_is_timeout_with_the_reason(time_limited, site_env, configless_cluster):
    site_env(configless_cluster)
    run, jid = time_limited
    err = run.log_path("bare", jid, stream="err")
    wait_until(lambda: err.exists() and "164/300" in err.read_text(errors="replace"), 60, "tqdm's output")
    assert status.collect(run)[0].progress == "164/300"
    # SLURM checks time limits about every 30 s: the job ends 60 to 100 s after it started
    wait_until(lambda: scheduler.query([jid])[jid].state not in scheduler.ACTIVE, 150, "the time limit")
    row = status.collect(run)[0]
    assert row.state == "TIMEOUT" and "TimeLimit" in row.why, row
    info = scheduler.job_info(jid)
    assert scheduler.hpc_state(info["JobState"], info["Reason"]) == "TIMEOUT"
