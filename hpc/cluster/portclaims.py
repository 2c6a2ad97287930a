"""Port blocks claimed by a `python -m hpc.cluster up` still starting its daemons, host-wide.

A block's ports are found free by binding them, but a cluster's daemons bind them only as they
start, seconds later. Two `up`s at the same moment (two directories whose default blocks collide,
or both moved off a busy block to the same next free one) would both find the block free and the
second would fail as its daemons start. So `up` chooses its block under a host-wide lock and claims
it until its daemons hold the ports; a block claimed by another `up` counts as in use.

    with PortClaims().locked() as table:        # brief: the choice only
        if not table.taken_by_other(base, directory):
            table.claim(base, directory)
    ... start the daemons ...
    PortClaims().release(directory)

The table is one JSON file beside its lock file in the host's temporary directory (both writable by
every user: clusters of two users share the host's ports). A claim whose `up` has died is ignored,
so a crash leaves nothing to clean up.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, Iterator

from hpc.cluster import layout as L
from hpc.cluster.daemons import ClusterError, port_free, process_alive

ENV_DIR = "HPC_PORT_CLAIMS_DIR"  # where the table lives (default: the host's temporary directory)
NAME = "hpc-cluster-port-claims"


class Table:
    """The claims, read under the lock: port base -> {"dir": cluster directory, "pid": its up}."""

    def __init__(self, claims: Dict[str, dict]) -> None:
        self.claims = claims

    def taken_by_other(self, base: int, directory: str | Path) -> bool:
        """Claimed by a live `up` of another directory."""
        c = self.claims.get(str(base))
        return bool(c) and c.get("dir") != str(directory) and process_alive(int(c.get("pid", 0)))

    def claim(self, base: int, directory: str | Path) -> None:
        self.release(directory)  # one block per directory: the one chosen now
        self.claims[str(base)] = {"dir": str(directory), "pid": os.getpid()}

    def release(self, directory: str | Path) -> None:
        for key in [k for k, c in self.claims.items() if c.get("dir") == str(directory)]:
            del self.claims[key]


class PortClaims:
    def __init__(self, where: str | Path | None = None) -> None:
        self.dir = Path(where or os.environ.get(ENV_DIR) or tempfile.gettempdir())
        self.file = self.dir / f"{NAME}.json"
        self.lock_file = self.dir / f"{NAME}.lock"

    @contextlib.contextmanager
    def locked(self) -> Iterator[Table]:
        """The table under the host-wide lock; written back, without dead claims, on exit. Where the
        lock file cannot be opened (another user's, on a host that protects files in sticky
        directories) no claim is seen or made: the ports' own check still applies."""
        try:
            fd = _open_shared(self.lock_file)
        except OSError:
            yield Table({})
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            table = Table(self._read())
            yield table
            live = {k: c for k, c in table.claims.items() if process_alive(int(c.get("pid", 0)))}
            with contextlib.suppress(OSError):
                self._write(live)
        finally:
            os.close(fd)  # releases the lock

    def release(self, directory: str | Path) -> None:
        with self.locked() as table:
            table.release(directory)

    def _read(self) -> Dict[str, dict]:
        try:
            claims = json.loads(self.file.read_text())
        except (OSError, ValueError):
            return {}  # none yet, or a torn file from a crash: claims are only ever a few seconds old
        if not isinstance(claims, dict):
            return {}
        return {k: c for k, c in claims.items() if isinstance(c, dict) and str(c.get("pid", "")).isdigit()}

    def _write(self, claims: Dict[str, dict]) -> None:
        fd = _open_shared(self.file, os.O_TRUNC)
        with os.fdopen(fd, "w") as f:
            json.dump(claims, f)


def _open_shared(path: Path, flags: int = 0) -> int:
    """Open a file every user of the host may write, creating it if it is not there."""
    try:
        return os.open(path, os.O_RDWR | flags)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o666)
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o666)  # past the umask
    return fd


def choose_block(layout: L.ClusterLayout, cluster_dir: Path, given: bool, log: Callable[[str], Any]) -> L.ClusterLayout:
    """The layout with its port block: a block in use, or claimed by another `up` still starting,
    moves to the next free one, unless the caller named it (`--port-base`, `given`); the block taken
    is saved with the cluster, so a later `up` keeps it, and claimed until `up` releases it."""
    with PortClaims().locked() as claims:
        def taken(base: int) -> bool:
            return claims.taken_by_other(base, cluster_dir)
        own = layout.port_base
        busy = [p for p in layout.all_ports() if not port_free(p)]
        why = (f"ports {busy} are in use" if busy else
               f"ports {own}..{own + L.PORT_BLOCK - 1} are claimed by another `hpc.cluster up` starting now"
               if taken(own) else None)
        if why and given:
            raise ClusterError(
                f"{why} (this cluster's block starts at {own}). HINT: stop what uses them, or pick "
                f"another block with `--port-base N` (ports N..N+{L.PORT_BLOCK - 1}).")
        if why:
            base = free_port_block(own, taken)
            if base is None:
                raise ClusterError(f"{why}, and every block of {L.PORT_RANGE[0]}..{L.PORT_RANGE[1] - 1} has a "
                                   f"port in use or is claimed by another `up` starting now. HINT: stop another local cluster (python -m hpc.cluster "
                                   f"down --dir D), or name a block outside that range with `--port-base N`.")
            log(f"{why}: this cluster takes ports {base}..{base + L.PORT_BLOCK - 1} instead")
            layout = dataclasses.replace(layout, port_base=base)
        claims.claim(layout.port_base, cluster_dir)
    return layout


def free_port_block(start: int, taken: Callable[[int], bool] = lambda base: False) -> int | None:
    """The first block of ports, from the one holding port `start` on (wrapping round the range),
    whose ports are all free and that is not `taken(base)`; None if every block has a port in use."""
    first = (start - L.PORT_RANGE[0]) // L.PORT_BLOCK
    for i in range(L.PORT_BLOCKS):
        base = L.PORT_RANGE[0] + ((first + i) % L.PORT_BLOCKS) * L.PORT_BLOCK
        if not taken(base) and all(port_free(p) for p in range(base, base + L.PORT_BLOCK)):
            return base
    return None
