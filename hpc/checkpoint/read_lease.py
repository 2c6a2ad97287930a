"""Read leases: a checkpoint being read is not pruned until its reader is done with it.

    with StoreReader(directory).reading() as state:      # an evaluation job on a live run
        engine.load(state[SHARDED_KEY], model)           # DCP reads the shards here, protected

``load()`` returns the directory of DCP's shards, which DCP reads later, outside the store's
retry; a writer with keep=1 would delete them under it. A reader therefore holds a shared
``flock`` on ``<store>/.lease-step-N`` while it reads step N; before deleting a checkpoint, the
pruning writer takes the exclusive lock without waiting, creating the file if no reader has yet:
the lock, not the file's existence, decides, so a reader that comes while the writer deletes
waits for its lock and then finds the checkpoint gone, never half of it. If a reader holds the
lease, the checkpoint is kept for now (beyond keep) and goes at a later save, once it is free.
The writer deletes the lease file while it holds the exclusive lock; a reader whose lock is on
a file that is no longer the one at the lease's path (deleted meanwhile) opens it again, so two
readers or a reader and the writer always lock the same file.

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
    fd = _locked(lease_path(directory, step))
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # drops the lock


def _locked(path: Path) -> int | None:
    """An open descriptor of the lease file at `path` holding a shared lock (None: a read-only
    store, which nobody prunes either). A lock taken on a file the writer deleted meanwhile
    (after pruning its step) protects nothing the next writer would check: taken again."""
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except OSError as err:
            if err.errno not in _NO_FLOCK:
                os.close(fd)
                raise
            return fd  # no flock here: nothing is enforced, nothing to check
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


@contextlib.contextmanager
def exclusive(directory: Path, step: int) -> Iterator[bool]:
    """Yield True when no reader holds a lease on `step` (and keep others out for the block);
    False when one does. The lease file is removed at the end of a True block."""
    path = lease_path(directory, step)
    try:  # created if no reader has made it yet: a reader that comes now must wait for this lock
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    except FileNotFoundError:  # the store itself is gone
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



def drop(directory: Path, step: int) -> None:
    """Remove the lease file of a step that is gone, unless someone holds it (a reader, or a
    writer about to decide on the step): it would otherwise stay, one file per pruned step."""
    with exclusive(directory, step):
        pass
