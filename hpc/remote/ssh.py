"""One ssh connection per command to a named cluster's login node, reused by every call it makes.

    python -c "from hpc.remote import clusters, ssh; print(ssh.Shell(clusters.find('a')).run('hostname'))"

Every call goes through ssh's ControlMaster: the first opens the connection, the others ride on it
(one TCP and key exchange per command; a poll is one round trip). The control socket lives in a
directory of the user's only (mode 0700, refused otherwise): whoever can reach it can run commands
as the user on the cluster. BatchMode=yes: ssh never asks for a password or a passphrase, and a host
key the user's known_hosts does not hold is refused as the user's ssh config says
(StrictHostKeyChecking is left to it): hpc never accepts a key silently. ServerAlive* ends a call
whose network dropped within about 15 s. A failure of ssh itself (exit 255) becomes one line naming
the cluster, what ssh said, and the ssh command to try by hand. An entry with ssh: local runs the
same commands in `sh -c` on this machine.
"""
from __future__ import annotations

import os
import shlex
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from hpc.remote.clusters import Cluster

SSH_FAILED = 255  # ssh's own exit status: the connection, not the remote command
NOT_FOUND = 127  # the remote shell's: the command (the interpreter) does not exist
CONTROL_ENV = "HPC_SSH_CONTROL_DIR"
BASE = ("-o", "BatchMode=yes", "-o", "ControlMaster=auto", "-o", "ControlPersist=60",
        "-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3")
# what ssh said -> what it means; the first that matches names the failure (a table, not branches)
CAUSES: Tuple[Tuple[str, str], ...] = (
    ("host key verification failed", "the host key is not trusted (not in known_hosts, or changed); "
                                      "run the command below once and check the fingerprint"),
    ("remote host identification has changed", "the host key changed; check with the cluster's admins"),
    ("permission denied", "the key was refused; check identity: in clusters.yaml and the remote authorized_keys"),
    ("could not resolve hostname", "unknown host; check ssh: in clusters.yaml"),
    ("connection refused", "nothing listens there; check the host and port"),
    ("timed out", "no answer from the host; check the network, the host and port"),
    ("broken pipe", "the connection dropped"),
    ("closed by remote host", "the connection dropped"),
    ("connection reset", "the connection dropped"),
)
ROUND_TRIPS = [0]  # ssh calls made by this process (the benchmarks read it)


class RemoteError(RuntimeError):
    """A cluster could not be reached, or its side refused: one line, with the command to try."""


def control_dir() -> Path:
    """The private directory of the control sockets (created 0700; refused when others can enter it)."""
    where = Path(os.environ.get(CONTROL_ENV) or os.path.join(tempfile.gettempdir(), f"hpc-ssh-{os.getuid()}"))
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = where.stat()
    if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
        raise RemoteError(f"{where} is not private (owner {st.st_uid}, mode {oct(stat.S_IMODE(st.st_mode))}); "
                          f"expected a directory only you can enter for ssh's control sockets. HINT: chmod 700 "
                          f"{where}, or point {CONTROL_ENV} at another.")
    return where


class Shell:
    """The login node of one named cluster."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    def cwd(self) -> Optional[str]:
        """Where a command starts: the home directory, as over ssh (ssh: local too)."""
        return os.path.expanduser("~") if self.cluster.ssh is None else None

    def ssh_argv(self, master: bool = True) -> List[str]:
        """ssh and its options up to the host (no command); master=False: as a user would type it."""
        c = self.cluster
        argv = ["ssh", *BASE, "-o", f"ControlPath={control_dir() / '%C'}"] if master else ["ssh"]
        argv += ["-p", str(c.port)] if c.port else []
        argv += ["-i", os.path.expanduser(c.identity)] if c.identity else []
        argv += ["-J", c.jump] if c.jump else []
        for name, value in c.options:
            argv += ["-o", f"{name}={value}"]
        return argv + [str(c.ssh)]

    def argv(self, command: str) -> List[str]:
        """The local argv that runs `command` (a shell line) on the login node."""
        if self.cluster.ssh is None:
            return ["sh", "-c", command]
        return [*self.ssh_argv(), command]

    def shown(self, command: str) -> str:
        """The command as --dry-run prints it: as the user would type it, without the control options."""
        if self.cluster.ssh is None:
            return f"sh -c {shlex.quote(command)}"
        return shlex.join([*self.ssh_argv(master=False), command])

    def python(self, args: Sequence[str], cwd: Optional[str] = None) -> str:
        """The shell line that runs the cluster's interpreter with `args`, after its setup line."""
        c = self.cluster
        line = f"exec {c.python} {shlex.join(args)}"
        if cwd:
            line = f"cd {shlex.quote(cwd)} && {line}"
        return f"{c.setup} && {line}" if c.setup else line

    def run(self, command: str, what: str, capture: bool = True) -> subprocess.CompletedProcess:
        """Run `command` there; RemoteError when ssh fails or the interpreter is missing. The remote
        command's own exit status is the caller's to read."""
        ROUND_TRIPS[0] += 1
        pipe = subprocess.PIPE if capture else None
        try:
            done = subprocess.run(self.argv(command), stdout=pipe, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                  cwd=self.cwd())
        except FileNotFoundError as err:
            raise RemoteError(f"{err.filename} not found on this machine; expected an ssh client to reach cluster "
                              f"{self.cluster.name}. HINT: install openssh-client.") from None
        self.check(done, what)
        return done

    def check(self, done: subprocess.CompletedProcess, what: str) -> None:
        said = (done.stderr or b"").decode(errors="replace").strip()
        if done.returncode == SSH_FAILED and self.cluster.ssh is not None:
            raise RemoteError(self.failure(what, said))
        if done.returncode == NOT_FOUND and self.cluster.python.split()[0] in said:
            raise RemoteError(f"{what} on cluster {self.cluster.name}: {last_line(said)}; expected the interpreter "
                              f"{self.cluster.python!r} there. HINT: set python: of {self.cluster.name} in "
                              f"clusters.yaml; check with {self.shown('command -v ' + self.cluster.python)}")

    def failure(self, what: str, said: str) -> str:
        low = said.lower()
        # nothing said: the master connection under this call ended (killed, or the network dropped)
        cause = next((meaning for words, meaning in CAUSES if words in low), "ssh failed" if said else
                     "the connection dropped")
        words = repr(last_line(said)) if said else "nothing"
        return (f"{what} on cluster {self.cluster.name} ({self.cluster.ssh}): {cause}: ssh said {words}; "
                f"expected a connection. HINT: try {self.shown('true')}")


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""
