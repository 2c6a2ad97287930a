"""Two sandbox clusters as two named clusters, reached through a real sshd (tests/sshd.py) from a
"laptop": a process whose PATH holds ssh and no SLURM client. A pipeline submitted to each, watched,
its logs read and a run cancelled from the laptop; the connection killed while the laptop waits,
and the retried submission queuing nothing twice.

    python -m pytest tests/slurm/test_remote.py -m slurm
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict

import pytest
import yaml

from hpc.rundir.run import RunDir
from tests.sshd import project, sshd  # noqa: F401 - fixture

pytestmark = pytest.mark.slurm


class Laptop:
    """Runs hpc's commands with no SLURM client on PATH, only ssh, and the named clusters' file."""

    def __init__(self, where: Path, clusters: Dict[str, dict]):
        self.bin = where / "bin"
        self.bin.mkdir()
        os.symlink(shutil.which("ssh"), self.bin / "ssh")
        (where / "clusters.yaml").write_text(yaml.safe_dump(clusters))
        self.control = Path(tempfile.mkdtemp(prefix="cm-"))
        self.env = {"PATH": str(self.bin), "HOME": os.environ.get("HOME", "/root"),
                    "HPC_CLUSTERS_FILE": str(where / "clusters.yaml"), "HPC_SSH_CONTROL_DIR": str(self.control)}
        self.proj = project(where / "proj")

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, *args], cwd=self.proj, env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def run(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
        proc = self.popen(*args)
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(args, proc.returncode, out, err)

    def submit(self, cluster: str, *args: str, pipeline: str = "mypkg.tiny") -> str:
        out = self.run("-m", "hpc.submit", pipeline, "--cluster", cluster, *args)
        assert out.returncode == 0, out.stdout + out.stderr
        return re.search(r"^run dir: (\S+)", out.stdout, re.M).group(1)

    def wait(self, address: str) -> list:
        out = self.run("-c", f"import hpc, json; print(json.dumps(hpc.Run.attach({address!r}).wait(timeout=200)))")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)


@pytest.fixture(scope="module")
def laptop(sshd, slurm_cluster, no_accounting_cluster, tmp_path_factory):  # noqa: F811
    where = tmp_path_factory.mktemp("laptop")

    def entry(cluster, runs: str) -> dict:
        setup = " && ".join(f"export {k}={shlex.quote(v)}" for k, v in cluster.env().items())
        return sshd.entry(runs=str(where / runs), setup=setup, partition="low")
    return Laptop(where, {"a": entry(slurm_cluster, "runs-a"), "b": entry(no_accounting_cluster, "runs-b")})


def test_a_pipeline_submitted_to_two_named_clusters_runs_on_each_watched_from_the_laptop(laptop):
    assert shutil.which("sbatch", path=laptop.env["PATH"]) is None
    addresses = {"a": laptop.submit("a", "tiny.parts=[0,1]")}
    api = laptop.run("-c", "import hpc; run = hpc.submit('mypkg.tiny', cluster='b', overrides=['tiny.parts=[0,1]'], "
                           "wait=True, timeout=200); print(repr(run), run.done())")
    assert api.returncode == 0, api.stderr
    addresses["b"] = re.search(r"hpc.Run\('(\S+)'\) True$", api.stdout, re.M).group(1)
    for name, address in addresses.items():
        assert address.startswith(f"{name}:{laptop.proj.parent / f'runs-{name}'}/tiny-")
        rows = laptop.wait(address)
        assert [r["state"] for r in rows] == ["COMPLETED"] * 3, rows
    listed = laptop.run("-m", "hpc.status")
    assert listed.returncode == 0, listed.stderr
    for address in addresses.values():
        assert re.search(rf"^{re.escape(address)}  tiny  3 task\(s\): 3 COMPLETED$", listed.stdout, re.M), listed.stdout
    status = laptop.run("-m", "hpc.status", addresses["a"])
    assert status.returncode == 0 and "second[1]" in status.stdout and "COMPLETED" in status.stdout, status
    logs = laptop.run("-m", "hpc.logs", addresses["b"], "--stage", "second", "--task", "1")
    assert logs.returncode == 0 and "stage second item 1 rank 0 finished" in logs.stdout, logs


def test_a_run_is_cancelled_from_the_laptop(laptop):
    address = laptop.submit("a", "tiny.parts=[0]", "tiny.sleep_s=120")
    run = RunDir(address.partition(":")[2])
    ids = {t["job_id"] for t in run.tasks()}
    out = laptop.run("-m", "hpc.cancel", address)
    assert out.returncode == 0 and out.stdout.startswith("cancelled: "), out.stdout + out.stderr
    assert set(out.stdout.split()[1:]) <= ids and out.stdout.split()[1:]
    rows = laptop.wait(address)
    assert {r["state"] for r in rows} <= {"CANCELLED", "NEVER"}, rows


def test_a_connection_killed_mid_wait_ends_the_wait_and_the_retry_submits_nothing_twice(laptop):
    waiting = laptop.popen("-m", "hpc.submit", "mypkg.tiny", "--cluster", "a", "tiny.parts=[0]", "tiny.sleep_s=15",
                           "--wait")
    line = waiting.stdout.readline()  # 'run dir: a:PATH (code ...)', printed before hpc.submit runs there
    address = re.match(r"run dir: (\S+)", line).group(1)
    run = RunDir(address.partition(":")[2])
    while not line.startswith("  second: "):  # the remote hpc.submit's lines: both stages queued
        assert line or waiting.poll() is None, waiting.stderr.read()
        line = waiting.stdout.readline()
    queued = {t["job_id"] for t in run.tasks()}
    drop(laptop)  # the laptop's ssh loses its master mid-wait
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 2, out + err
    line = err.strip().splitlines()[-1]  # after the push's one line
    assert "the connection dropped" in line
    assert line.startswith("error: submitting on cluster a") and f"python -m hpc.status {address}" in line
    retry = laptop.run("-m", "hpc.submit", "mypkg.tiny", "--cluster", "a", "--run-dir", address.partition(":")[2],
                       "tiny.parts=[0]", "tiny.sleep_s=15")
    assert retry.returncode == 0 and "nothing to submit" in retry.stdout, retry.stdout + retry.stderr
    assert {t["job_id"] for t in RunDir(run.path).tasks()} == queued
    assert [r["state"] for r in laptop.wait(address)] == ["COMPLETED", "COMPLETED"]


def drop(laptop: Laptop) -> None:
    """The connection drops: the laptop's ssh master to cluster a is killed."""
    port = yaml.safe_load(Path(laptop.env["HPC_CLUSTERS_FILE"]).read_text())["a"]["port"]
    master = subprocess.run(["ssh", "-o", f"ControlPath={laptop.control}/%C", "-p", str(port), "-O", "check",
                             "root@127.0.0.1"], capture_output=True, text=True)
    os.kill(int(re.search(r"pid=(\d+)", master.stderr).group(1)), 9)
