"""One writing job per checkpoint store: a lock held by the committing rank, checked by the others.

    python -m pytest tests/test_checkpoint_faults.py -k writer    # a second writer is refused

Several ranks of one job write into one store (each its own rank file, rank 0 commits), so the lock
is held by rank 0 alone, and it stands for the whole job attempt: rank 0 takes an exclusive
``flock`` on ``<store>/.writer.lock`` at its first save and writes the holder into the file (job
attempt, SLURM job id, host, pid). Ranks > 0 take no lock: at their first save they wait until the
file names their own attempt, so a refused job's other ranks never write into the live job's
temporary directories. Readers (load) take no lock at all.

A stale lock cannot block: flock belongs to the open file, and the kernel drops it when the last
process holding that file dies, SIGKILL included (on NFS, when the client's lease runs out). What a
dead holder leaves is only the text naming it, which the next holder overwrites. A forked checkpoint
writer shares its parent's lock, so a write still running when its trainer died keeps the store
locked until it ends. Where the filesystem has no flock (Lustre mounted without ``-o flock``), the
store warns once and writes unlocked, as it did before there was a lock; where the lock is taken on
this node only (Lustre's ``localflock``, NFS's ``nolock``), it warns that a writer on another node
is not kept out.

Within one process, stores of the same directory share the lock: a test or a notebook that builds a
second store without closing the first is one writer, not two.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
import warnings
from pathlib import Path
from typing import Any

from hpc.fs.sharedfs import LOCK_HINT, local_locks

log = logging.getLogger(__name__)

LOCK_NAME = ".writer.lock"
# How long a rank > 0 waits for its rank 0 to hold the lock (both are at the same step's save).
OWNER_WAIT_S = 60.0
PROBE_GRACE_S = 1.0  # how long a taken lock may be a peer's momentary probe rather than a writer
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
_held: dict[str, list] = {}  # realpath of a lock file -> [fd, number of stores using it], this process


class StoreLocked(RuntimeError):
    """Another job writes into this checkpoint store."""


def generation() -> str:
    """Identifies this attempt of the job, identical on every rank without communication.

    Stale rank files left in a temporary directory by a killed earlier attempt (requeued, or
    restarted in place) carry another generation, so rank 0 never commits them. Computed in the
    training process, never in a forked writer (whose parent pid is the training process).
    """
    env = os.environ
    job = env.get("SLURM_JOB_ID") or env.get("TORCHELASTIC_RUN_ID") or f"pid{os.getppid()}"
    in_place = env.get("HPC_RESTART_IN_PLACE", "0")  # a new srun step of the same allocation (hpc.recovery.inplace)
    return f"{job}.{env.get('SLURM_RESTART_COUNT', '0')}" + f".{in_place}" * (in_place not in ("", "0"))


def holder(generation: str) -> dict[str, Any]:
    return {"attempt": generation, "job": os.environ.get("SLURM_JOB_ID"), "host": socket.gethostname(),
            "pid": os.getpid(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def read_holder(directory: Path) -> dict[str, Any]:
    """The holder named in the lock file; {} when absent or half written."""
    try:
        info = json.loads((directory / LOCK_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def refusal(directory: Path, info: dict[str, Any]) -> StoreLocked:
    who = (f"job {info.get('job') or '(no SLURM job)'} on host {info.get('host', '?')}, "
           f"pid {info.get('pid', '?')}, since {info.get('since', '?')}") if info else \
        "a process that has not written its name yet"
    hint = f"scancel {info['job']}, " if info.get("job") else "stop it, "
    return StoreLocked(
        f"checkpoint store {directory} already has a writer: {who}; expected one writing job per "
        f"store. HINT: {hint}or point this run at another directory (a dead holder's lock is "
        "released by the kernel, so this one is alive).")


class WriterLock:
    """Rank 0's lock on a store directory; acquire() refuses a second writer with StoreLocked."""

    def __init__(self, directory: Path, generation: str) -> None:
        self.path = directory / LOCK_NAME
        self.generation = generation
        self._key: str | None = None

    def acquire(self) -> None:
        if self._key is not None:
            return
        key = os.path.realpath(self.path)
        if key in _held:
            _held[key][1] += 1
            self._key = key
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _lock_exclusive(fd)
        except BlockingIOError:
            os.close(fd)
            raise refusal(self.path.parent, read_holder(self.path.parent)) from None
        except OSError as err:
            if err.errno not in _NO_FLOCK:
                os.close(fd)
                raise
            _warn(f"checkpoint store {self.path.parent}: the filesystem does not support flock "
                  f"({err.strerror}); writing without a lock, so a second writer is not refused. {LOCK_HINT}")
        local = local_locks(self.path.parent)  # localflock, nolock: no lock against other nodes' writers
        _warn(f"checkpoint store: {local}") if local else None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder(self.generation)).encode(), 0)
        os.fsync(fd)
        _held[key] = [fd, 1]
        self._key = key

    def release(self) -> None:
        key, self._key = self._key, None
        if key is None or key not in _held:
            return
        _held[key][1] -= 1
        if _held[key][1] == 0:
            fd = _held.pop(key)[0]
            # LOCK_UN releases also the copies of the fd held by forked children (DataLoader workers)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def wait_for_owner(directory: Path, generation: str, timeout_s: float | None = None) -> None:
    """Ranks > 0: return once the lock names this job attempt. Nobody holding it also returns (no
    live writer to protect; rank 0 takes it at this same save). A lock held by another attempt
    through the whole wait is a second writer: StoreLocked naming it."""
    deadline = time.monotonic() + (OWNER_WAIT_S if timeout_s is None else timeout_s)
    while True:
        info = read_holder(directory)
        if info.get("attempt") == generation or not _is_held(directory / LOCK_NAME):
            return
        if time.monotonic() > deadline:
            raise refusal(directory, info)
        time.sleep(0.05)  # rank 0 may hold the lock and not have written its name yet


def _lock_exclusive(fd: int) -> None:
    """The exclusive lock, refused (BlockingIOError) only if it stays taken for PROBE_GRACE_S.
    The other ranks' _is_held probes take a shared lock for an instant at the first save of a
    resumed attempt, exactly when rank 0 locks; a writer holds it for its whole job."""
    deadline = time.monotonic() + PROBE_GRACE_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _is_held(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # no flock here: only the name can tell
        return True
    finally:
        os.close(fd)  # closing drops the shared lock just taken
    return False


def _warn(message: str) -> None:
    log.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
