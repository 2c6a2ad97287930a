"""A real sshd for the tests of named clusters: on 127.0.0.1, a free port, its own host key and one
authorized key, and a known_hosts file for the client side.

    from tests.sshd import sshd, clusters_file   # fixtures; tests/slurm/test_remote*.py use them

The "laptop" (the client side) reaches it as any login node: ssh with BatchMode, the key below and
the known_hosts below, through hpc.remote. Skipped where openssh-server is missing outside CI
(python -m hpc.cluster install installs it); failed in CI.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

import pytest
import yaml

SSHD = "/usr/sbin/sshd"
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
CONFIG = """\
Port {port}
ListenAddress 127.0.0.1
HostKey {dir}/host_ed25519
AuthorizedKeysFile {dir}/authorized_keys
PidFile {dir}/sshd.pid
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
MaxSessions 100
MaxStartups 100
LogLevel ERROR
"""


@dataclass
class Sshd:
    dir: Path
    port: int
    proc: subprocess.Popen
    identity: Path  # the authorized key's private half
    known_hosts: Path  # holds this sshd's host key

    def entry(self, **fields: Any) -> Dict[str, Any]:
        """A clusters.yaml entry that reaches this sshd as the current user."""
        return {"ssh": f"{os.environ.get('USER') or 'root'}@127.0.0.1", "port": self.port,
                "identity": str(self.identity),
                "options": {"UserKnownHostsFile": str(self.known_hosts), "GlobalKnownHostsFile": "/dev/null",
                            "IdentitiesOnly": "yes"},
                "python": sys.executable, **fields}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


def start(directory: Path) -> Sshd:
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    host_pub = keygen(directory / "host_ed25519")
    (directory / "authorized_keys").write_text(keygen(directory / "client_ed25519") + "\n")
    port = free_port()
    (directory / "sshd_config").write_text(CONFIG.format(port=port, dir=directory))
    known = directory / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {' '.join(host_pub.split()[:2])}\n")
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(directory / "sshd_config")],
                            stdout=subprocess.DEVNULL, stderr=open(directory / "sshd.log", "wb"))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {(directory / 'sshd.log').read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return Sshd(directory, port, proc, directory / "client_ed25519", known)
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"sshd did not listen on 127.0.0.1:{port} within 20 s")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory) -> Iterator[Sshd]:
    if not (os.path.exists(SSHD) and shutil.which("ssh")):
        message = f"{SSHD} or ssh missing. HINT: python -m hpc.cluster install (it installs openssh-server)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    found = start(tmp_path_factory.mktemp("sshd"))
    try:
        yield found
    finally:
        found.proc.terminate()
        try:
            found.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            found.proc.kill()


@pytest.fixture
def clusters_file(tmp_path, monkeypatch):
    """write(entries) -> the clusters.yaml this test's process and its subprocesses read; ssh's
    control sockets in a directory of this test's own."""
    control = Path(tempfile.mkdtemp(prefix="cm-"))  # short: a socket's path holds at most 107 bytes
    monkeypatch.setenv("HPC_SSH_CONTROL_DIR", str(control))

    def write(entries: Dict[str, Any], path: Optional[Path] = None) -> Path:
        where = path or tmp_path / "clusters.yaml"
        where.write_text(yaml.safe_dump(entries))
        monkeypatch.setenv("HPC_CLUSTERS_FILE", str(where))
        return where
    return write


def project(where: Path) -> Path:
    """A user's project without git: mypkg.tiny, the tiny test pipeline under its own module name."""
    pkg = where / "mypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    source = (Path(__file__).with_name("tiny_pipeline.py")).read_text()
    (pkg / "tiny.py").write_text(source.replace("tests.tiny_pipeline", "mypkg.tiny"))
    return where
