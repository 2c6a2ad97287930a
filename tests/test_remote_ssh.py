"""Named clusters through a real sshd (tests/sshd.py), no SLURM needed: what each ssh failure says,
hpc missing or another version there, the content-addressed push and a push cut midway, one
connection per command, --dry-run without connecting.

    python -m pytest tests/test_remote_ssh.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hpc
from hpc.cluster import install
from hpc.remote import clusters, push, ssh, store
from tests.sshd import clusters_file, free_port, keygen, project, sshd  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parents[1]


def hpc_cmd(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def one_line_error(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 2, out.stdout + out.stderr
    line, = out.stderr.strip().splitlines()
    assert line.startswith("error: ") and "HINT:" in line
    return line


def test_install_brings_the_ssh_server_the_tests_use():
    assert "openssh-server" in install.PACKAGES


def test_a_host_key_not_in_known_hosts_is_refused_never_accepted(sshd, clusters_file, tmp_path):  # noqa: F811
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    entry = sshd.entry(runs=str(tmp_path / "runs"))
    entry["options"]["UserKnownHostsFile"] = str(empty)
    clusters_file({"a": entry})
    line = one_line_error(hpc_cmd("hpc.status", "a:/runs/x"))
    assert "host key is not trusted" in line and f"HINT: try ssh -p {sshd.port}" in line and line.endswith("true")
    assert empty.read_text() == ""  # nothing was added to known_hosts


def test_a_refused_key_and_a_closed_port_each_name_what_failed(sshd, clusters_file, tmp_path):  # noqa: F811
    keygen(tmp_path / "other")
    clusters_file({"a": sshd.entry(identity=str(tmp_path / "other")),
                   "b": {**sshd.entry(), "port": free_port()}})
    assert "the key was refused" in one_line_error(hpc_cmd("hpc.status", "a:/runs/x"))
    assert "nothing listens there" in one_line_error(hpc_cmd("hpc.logs", "b:/runs/x"))


def test_a_missing_interpreter_hpc_missing_and_another_hpc_are_refused_with_the_fix(sshd, clusters_file, tmp_path):  # noqa: F811
    fake = tmp_path / "fake" / "hpc"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("__version__ = '0.0.1'\n")
    clusters_file({"gone": sshd.entry(python="/nonexistent/bin/python3"),
                   "bare": sshd.entry(python=f"{sys.executable} -S"),  # no site-packages: no hpc
                   "old": sshd.entry(python=f"env PYTHONPATH={fake.parent} {sys.executable}")})
    proj = project(tmp_path / "proj")
    line = one_line_error(hpc_cmd("hpc.submit", "mypkg.tiny", "--cluster", "gone", cwd=proj))
    assert "expected the interpreter '/nonexistent/bin/python3'" in line
    line = one_line_error(hpc_cmd("hpc.submit", "mypkg.tiny", "--cluster", "bare", cwd=proj))
    assert "hpc is not importable" in line and f"pip install hpc=={hpc.__version__}" in line
    line = one_line_error(hpc_cmd("hpc.submit", "mypkg.tiny", "--cluster", "old", cwd=proj))
    assert "runs hpc 0.0.1" in line and f"expected {hpc.__version__}" in line


def test_a_push_sends_only_what_the_cluster_lacks(sshd, clusters_file, tmp_path):  # noqa: F811
    clusters_file({"a": sshd.entry(runs=str(tmp_path / "runs"))})
    shell = ssh.Shell(clusters.find("a"))
    proj = project(tmp_path / "proj")
    (proj / "data.bin").write_bytes(bytes(range(256)) * 64)
    runs = str(tmp_path / "runs")
    where, sent = push.send(shell, push.local_tree(proj), runs)
    assert sent == sum(p.stat().st_size for p in proj.rglob("*") if p.is_file())
    assert (Path(where) / "mypkg" / "tiny.py").read_text() == (proj / "mypkg" / "tiny.py").read_text()
    assert push.send(shell, push.local_tree(proj), runs) == (where, 0)  # unchanged: nothing sent
    (proj / "mypkg" / "__init__.py").write_text("EDITED = 1\n")
    other, sent = push.send(shell, push.local_tree(proj), runs)
    assert other != where and sent == len("EDITED = 1\n")
    assert (Path(other) / "mypkg" / "__init__.py").read_text() == "EDITED = 1\n"


def test_a_push_cut_midway_leaves_nothing_a_job_would_use_and_the_next_completes(sshd, clusters_file, tmp_path):  # noqa: F811
    clusters_file({"a": sshd.entry(runs=str(tmp_path / "runs"))})
    shell = ssh.Shell(clusters.find("a"))
    proj = project(tmp_path / "proj")
    (proj / "big.bin").write_bytes(b"x" * (1 << 20))
    tree, runs = push.local_tree(proj), str(tmp_path / "runs")
    cut = subprocess.Popen(shell.argv(shell.python(["-m", "hpc.remote.store", "put", push.store_of(runs)])),
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    cut.stdin.write(tree.header())
    cut.stdin.flush()
    lacking = json.loads(cut.stdout.readline())
    big = next(d for rel, d, _ in tree.files if rel == "big.bin")
    assert big in lacking
    for digest in lacking:  # every object whole but the big one: half of it, then ssh is killed
        data = push.read(proj, next(rel for rel, d, _ in tree.files if d == digest))
        cut.stdin.write(f"{len(data)}\n".encode() + (data[: len(data) // 2] if digest == big else data))
        if digest == big:
            break
    cut.stdin.flush()
    cut.kill()
    cut.wait()
    store_dir = Path(push.store_of(runs))
    deadline = time.monotonic() + 30  # the cluster's side sees its input end and removes its temporary
    while any(store_dir.rglob(".tmp-*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not store.object_path(store_dir, big).exists()
    assert not any(store_dir.rglob(".tmp-*"))
    assert not (store_dir / "trees").exists() or not any((store_dir / "trees").iterdir())
    assert store.existing_tree(store_dir, tree.tree) is None  # no tree: a submission would push it again
    where, sent = push.send(shell, tree, runs)
    assert (Path(where) / "big.bin").stat().st_size == 1 << 20 and sent < (1 << 20) + 10_000


def test_one_command_makes_one_connection_that_its_calls_share(sshd, clusters_file, tmp_path):  # noqa: F811
    clusters_file({"a": sshd.entry(runs=str(tmp_path / "runs"))})
    shell = ssh.Shell(clusters.find("a"))
    masters = []
    for _ in range(3):
        shell.run("true", "a test call")
        check = subprocess.run([*shell.ssh_argv()[:-1], "-O", "check", shell.cluster.ssh], capture_output=True,
                               text=True)
        masters.append(check.stderr.strip())
    assert masters[0].startswith("Master running") and len(set(masters)) == 1, masters
    assert ssh.control_dir().stat().st_mode & 0o077 == 0


def test_dry_run_shows_the_remote_commands_without_connecting(clusters_file, tmp_path):  # noqa: F811
    clusters_file({"a": {"ssh": "alice@127.0.0.1", "port": free_port(), "python": "/opt/py/bin/python",
                         "runs": "/scratch/alice/runs", "partition": "gpu"}})
    out = hpc_cmd("hpc.submit", "mypkg.tiny", "--cluster", "a", "--dry-run", "tiny.parts=[0]",
                  cwd=project(tmp_path / "proj"))
    assert out.returncode == 0, out.stderr
    commands = [line.strip() for line in out.stdout.splitlines() if line.strip().startswith("ssh ")]
    assert len(commands) == 2, out.stdout
    assert f"-m hpc.remote.land {hpc.__version__} /scratch/alice/runs " in commands[0]
    assert " -- mypkg.tiny stages.first.partition=gpu stages.second.partition=gpu" in commands[0]
    assert "--cluster slurm" in commands[0]
    assert "-m hpc.remote.store put /scratch/alice/runs/.hpc-code" in commands[1]


def test_a_local_entry_runs_the_same_commands_without_ssh(clusters_file, tmp_path):  # noqa: F811
    clusters_file({"home": {"ssh": "local", "python": sys.executable, "runs": str(tmp_path / "runs")}})
    out = hpc_cmd("hpc.status")
    assert out.returncode == 0 and out.stdout.strip() == f"home:(no runs under {tmp_path / 'runs'})", out


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB file system (tmpfs), where this machine lets the tests mount one."""
    where = tmp_path / "small"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (not root, or no CAP_SYS_ADMIN)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_full_disk_on_the_cluster_is_one_line_and_leaves_nothing_a_job_would_use(sshd, clusters_file, tmp_path,  # noqa: F811
                                                                                   full_disk):
    clusters_file({"a": sshd.entry(runs=str(full_disk / "runs"))})
    proj = project(tmp_path / "proj")
    (proj / "data.bin").write_bytes(os.urandom(200_000))
    line = one_line_error(hpc_cmd("hpc.submit", "mypkg.tiny", "--cluster", "a", cwd=proj))
    assert line.startswith("error: pushing the code to cluster a failed: push into ") and line.count("error:") == 1
    assert "No space left on device" in line and "free space there" in line, line
    code = full_disk / "runs" / ".hpc-code"
    assert not any(code.rglob(".tmp-*")) and not (code / "trees").exists()
