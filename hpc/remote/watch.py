"""A run on a named cluster, watched from this machine: NAME:RUN_DIR for the commands and the API.

    python -m hpc.status jean-zay:/scratch/alice/hpc-runs/tiny-20260101-120000-ab12
    python -m hpc.logs jean-zay:/scratch/.../tiny-... -f;  python -m hpc.cancel jean-zay:/scratch/...
    hpc.Run.attach("jean-zay:/scratch/...").wait()
    python -m hpc.status          # no argument: recent runs on every named cluster, one line each

Each command is the same command run by the cluster's interpreter, on its login node, with the
path: one ssh call (a poll of a run of any size is one round trip; the cluster asks its scheduler
once, as a local status does), its output passed through. RemoteRun's methods are hpc.Run's,
called there; wait() waits there, so a dropped connection ends only the waiting: one line says so,
and the jobs go on.
"""
from __future__ import annotations

import json
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpc.config.checks import ConfigError
from hpc.remote import clusters
from hpc.remote.ssh import RemoteError, Shell, last_line
from hpc.rundir.run import RunDirError

# hpc.Run's method, called by the cluster's interpreter: its answer as JSON, or the error's kind and words
CALL = """import json, sys
import hpc
try:
    out = getattr(hpc.Run.attach(sys.argv[1]), sys.argv[2])(*json.loads(sys.argv[3]))
except (RuntimeError, ValueError, TimeoutError) as err:
    sys.exit(f"{type(err).__name__}: {err}")
print(json.dumps(out, default=str))
"""
ERRORS = {"RunDirError": RunDirError, "ValueError": ValueError, "TimeoutError": TimeoutError,
          "ResultError": RuntimeError, "ConfigError": ConfigError}
RECENT = 5  # runs per cluster that python -m hpc.status lists with no argument


def split(address: str) -> Optional[Tuple[clusters.Cluster, str]]:
    """(cluster, path there) for NAME:PATH with NAME a named cluster; None for a local path. A NAME
    the file does not have, given a path that does not exist here, is refused with the closest names."""
    name, sep, path = address.partition(":")
    if not sep or not clusters.NAME.fullmatch(name) or not path:
        return None
    known = clusters.load()
    if name in known:
        return known[name], path
    from pathlib import Path  # a local path that holds a colon stays a local path

    if known and not Path(address).exists():
        clusters.find(name, known)
    return None


def forward(module: str, argv: Sequence[str], address: str) -> Optional[int]:
    """Run `python -m module argv` on the cluster `address` names, with its path in its place; its
    exit status (None: `address` is a local path). Output passes through; failures are one line."""
    try:
        where = split(address)
        if where is None:
            return None
        cluster, path = where
        args = [path if a == address else a for a in argv]
        shell = Shell(cluster)
        done = shell.run(shell.python(["-m", module, *args]), f"python -m {module}", capture=False)
    except (RemoteError, ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sys.stderr.write(done.stderr.decode(errors="replace"))
    return done.returncode


def recent(out=print) -> int:
    """Recent runs on every named cluster, one line each; a cluster that cannot be reached: one line."""
    try:
        found = clusters.load()
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not found:
        out(f"no named clusters ({clusters.path()} does not exist). HINT: pass a run directory, or name your "
            "clusters there (docs/remote.md).")
        return 2
    failed = 0
    for cluster in found.values():
        shell = Shell(cluster)
        try:
            done = shell.run(shell.python(["-m", "hpc.remote.recent", cluster.runs, str(RECENT)]), "listing runs")
        except RemoteError as err:
            out(f"{cluster.name}: error: {err}")
            failed += 1
            continue
        lines = done.stdout.decode(errors="replace").splitlines()
        if done.returncode:
            out(f"{cluster.name}: error: {last_line(done.stderr.decode(errors='replace'))}")
            failed += 1
        for line in lines or ([] if done.returncode else [f"(no runs under {cluster.runs})"]):
            out(f"{cluster.name}:{line}")
    return 2 if failed == len(found) else 0


class RemoteRun:
    """A run (or sweep) directory on a named cluster: hpc.Run's methods, each one ssh call."""

    def __init__(self, cluster: clusters.Cluster, path: str):
        self.cluster, self.path = cluster, str(path)

    def __repr__(self) -> str:
        return f"hpc.Run({self.address!r})"

    @property
    def address(self) -> str:
        return f"{self.cluster.name}:{self.path}"

    def call(self, method: str, *args: Any) -> Any:
        shell = Shell(self.cluster)
        done = shell.run(shell.python(["-c", CALL, self.path, method, json.dumps(args)]), f"{method}() of {self.path}")
        if done.returncode:
            kind, _, words = last_line(done.stderr.decode(errors="replace")).partition(": ")
            raise ERRORS.get(kind, RemoteError)(f"cluster {self.cluster.name}: {words or kind or 'no answer'}")
        return json.loads(done.stdout)

    def status(self) -> List[Dict[str, Any]]:
        return self.call("status")

    def wait(self, timeout: Optional[float] = None, poll_s: float = 2.0) -> List[Dict[str, Any]]:
        """hpc.Run.wait, waiting on the cluster; a dropped connection: RemoteError, the jobs go on."""
        try:
            return self.call("wait", timeout, poll_s)
        except RemoteError as err:
            raise RemoteError(f"{err}; the jobs go on. HINT: python -m hpc.status {self.address}") from None

    def done(self) -> bool:
        return self.call("done")

    def logs(self, stage: Optional[str] = None, task: Any = None, rank: int = 0, err: bool = False) -> str:
        return self.call("logs", stage, task, rank, err)

    def metrics(self) -> Dict[str, Any]:
        return self.call("metrics")

    def cancel(self, stage: Optional[str] = None) -> List[str]:
        return self.call("cancel", stage)


def attach(address: str) -> Optional[RemoteRun]:
    """The RemoteRun NAME:PATH names; None for a local path."""
    where = split(address)
    return None if where is None else RemoteRun(*where)
