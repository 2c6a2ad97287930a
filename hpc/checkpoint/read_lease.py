"""Read leases: a checkpoint being read is not pruned until its reader is done with it.

    with StoreReader(directory).reading() as state:      # an evaluation job on a live run
        engine.load(state[SHARDED_KEY], model)           # DCP reads the shards here, protected

``load()`` returns the directory of DCP's shards, which DCP reads later, outside the store's
retry; a writer with keep=1 would delete them under it. A reader therefore holds a shared
``flock`` on ``<store>/.lease-step-N`` while it reads step N; before deleting a checkpoint, the
pruning writer takes the exclusive lock without waiting. If a reader holds it, the checkpoint is
kept for now (beyond keep) and goes at a later save, once the lease is free. The writer deletes
the lease file while it holds the exclusive lock, so a reader that opened the file just before
finds the checkpoint gone once it gets its lock, and moves on to the next newest.

flock is dropped by the kernel when the reader dies, SIGKILL included: a dead reader blocks no
pruning. Where the filesystem has no flock, leases are not enforced (the writer prunes as
before) and readers still retry from a fresh listing.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path
from typing import Iterator

_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


def lease_path(directory: Path, step: int) -> Path:
    return Path(directory) / f".lease-step-{step}"


@contextlib.contextmanager
def shared(directory: Path, step: int) -> Iterator[None]:
    """Hold a read lease on step `step` of the store at `directory` for the block."""
    try:
        fd = os.open(lease_path(directory, step), os.O_RDONLY | os.O_CREAT, 0o666)
    except OSError:  # a read-only store: nobody prunes it either
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except OSError as err:
            if err.errno not in _NO_FLOCK:
                raise
        yield
    finally:
        os.close(fd)  # drops the lock


@contextlib.contextmanager
def exclusive(directory: Path, step: int) -> Iterator[bool]:
    """Yield True when no reader holds a lease on `step` (and keep others out for the block);
    False when one does. The lease file is removed at the end of a True block."""
    path = lease_path(directory, step)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:  # never read under a lease
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        except OSError as err:
            if err.errno not in _NO_FLOCK:
                raise
        yield True
        with contextlib.suppress(OSError):
            os.unlink(path)
    finally:
        os.close(fd)

