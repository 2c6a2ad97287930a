"""Start and stop the daemons of a local cluster, each in the foreground of a process we own.

    from hpc.cluster.daemons import Daemon
    Daemon("munged", [...], layout).start()

Every daemon runs with -D/-F (no self-daemonising), in its own session, with its pid recorded in
`run/<name>.pid`, so `down` stops exactly what `up` started and never a process it does not own.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hpc.cluster.layout import ClusterLayout

# Set in every daemon's environment; job steps inherit it, so `down` finds this cluster's jobs.
MARK = "HPC_LOCAL_CLUSTER"


class ClusterError(RuntimeError):
    """A cluster operation failed; the message says what to do and which log to read."""


@dataclass
class Daemon:
    name: str  # also the pid file and log file stem
    argv: list[str]
    layout: ClusterLayout
    ready: Callable[[], bool]  # True once the daemon answers
    start_timeout_s: float = 30.0
    program: str = ""  # the program the pid must run once started (default argv[0]; differs behind a wrapper)

    @property
    def pid_file(self) -> Path:
        return self.layout.path("run", f"{self.name}.pid")

    @property
    def log_file(self) -> Path:
        return self.layout.path("log", f"{self.name}.out")

    def pid(self) -> int | None:
        """The recorded pid if that process is still alive and still runs our program."""
        try:
            pid = int(self.pid_file.read_text())
        except (OSError, ValueError):
            return None
        return pid if _runs(pid, self.program or self.argv[0]) else None

    def start(self, env: dict[str, str]) -> int:
        running = self.pid()
        if running:
            return running
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    cwd=self.layout.dir)
        self.pid_file.write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ClusterError(
                    f"{self.name} exited at start with status {proc.returncode}. "
                    f"HINT: read {self.log_file} and the daemon's own log under {self.layout.path('log')}.")
            if self.ready():
                return proc.pid
            time.sleep(0.2)
        raise ClusterError(f"{self.name} did not become ready within {self.start_timeout_s:.0f} s. "
                           f"HINT: read {self.log_file} and logs under {self.layout.path('log')}.")

    def stop(self, timeout_s: float = 15.0) -> bool:
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        terminate([pid], timeout_s)
        self.pid_file.unlink(missing_ok=True)
        return True


def terminate(pids: list[int], timeout_s: float) -> None:
    """SIGTERM, wait, then SIGKILL whatever is left."""
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(process_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if process_alive(pid):
            _signal(pid, signal.SIGKILL)
    for pid in pids:
        _reap(pid)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def unix_socket_live(path: Path) -> bool:
    """Something accepts connections on the Unix socket at `path` (a leftover file refuses them)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(0.5)
        return s.connect_ex(str(path)) == 0


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def job_processes(conf: Path, directory: Path | None = None) -> list[int]:
    """Job step daemons (slurmstepd) of this cluster and all their descendants.

    slurmstepd inherits slurmd's environment, so SLURM_CONF (a configless slurmd has none:
    HPC_LOCAL_CLUSTER, set for every daemon) in its environ names the cluster it belongs to; user
    processes are found as its descendants, never by a broad match."""
    markers = {f"SLURM_CONF={conf}".encode()}
    if directory:
        markers.add(f"{MARK}={directory}".encode())
    children: dict[int, list[int]] = {}
    roots = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(pid)
            if "slurmstepd" in stat.split(")")[0] and markers & set((entry / "environ").read_bytes().split(b"\0")):
                roots.append(pid)
        except (OSError, IndexError, ValueError):
            continue
    found, stack = [], list(roots)
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def _runs(pid: int, program: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return False
    return process_alive(pid) and os.path.basename(cmdline) == os.path.basename(program)


def process_alive(pid: int, proc: str = "/proc") -> bool:
    """Running: neither gone nor a zombie (a daemon whose parent exited may never be reaped).

    A process /proc does not show may be another user's on a host that mounts /proc with hidepid:
    kill(pid, 0) then tells "no such process" from "not yours", and one that exists counts as
    running (its state cannot be read, so another user's zombie counts too)."""
    if pid <= 0:  # kill(0, ...) and kill(-1, ...) address groups, not a process
        return False
    try:
        state = Path(f"{proc}/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return _exists_elsewhere(pid)
    except (OSError, IndexError):
        return False
    return state != "Z"


def _exists_elsewhere(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only the checks, nothing is sent
    except PermissionError:
        return True  # it exists, and is another user's
    except (OSError, OverflowError):
        return False
    return True


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    # Daemons started by this very process (tests) become zombies until waited for.
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def ensure_hosts(names: list[str]) -> None:
    """Node names must resolve for a rendezvous at MASTER_ADDR=n1; map them to loopback."""
    unresolved = []
    for n in names:
        try:
            socket.gethostbyname(n)
        except OSError:
            unresolved.append(n)
    if not unresolved:
        return
    try:
        with open("/etc/hosts", "a") as f:
            f.write(f"127.0.0.1 {' '.join(unresolved)}  # hpc local cluster nodes\n")
    except PermissionError as e:
        raise ClusterError(f"node names {unresolved} do not resolve and /etc/hosts is not writable. "
                           f"HINT: add `127.0.0.1 {' '.join(unresolved)}` to /etc/hosts.") from e
