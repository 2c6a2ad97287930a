"""Atomic file writes and directory fsync: the one implementation, for run directories and checkpoints.

    python -c "from hpc.fs.atomic import write_bytes; write_bytes('/tmp/x.json', b'{}')"

A reader sees the old file or the whole new one, never a part: the bytes go to a temporary name in
the same directory, are fsynced, and the temporary file is renamed over the target. A failed write
removes its temporary file (a partial file on a full disk would keep the disk full).

Two kinds of temporary name, because the two users differ:
  - ``unique=True`` (run directories): ``.NAME.<pid>.<random>.tmp``, so that several processes
    writing the same file (a manifest, a status file) never share a temporary file;
  - ``unique=False`` (checkpoints): ``NAME.part``. Each checkpoint file has exactly one writer
    (its rank, under the store's lock), and the fixed name lets a later writer and the fault
    campaigns find what a killed write left behind.
``sync_dir=True`` also fsyncs the directory, which makes the rename itself durable. A checkpoint's
files skip it: the store fsyncs once, when it renames the whole step directory. ``durable=False``
skips both fsyncs and keeps only the atomic rename: for a message whose content something durable
repeats (a rank's report to the checkpoint's committer, copied into the fsynced marker).

Imports no torch: ``--dry-run`` and ``hpc.status`` write through it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import BinaryIO, Iterator, List

from hpc.fs.sharedfs import fsync_dir  # EINVAL or ENOTSUP there (some network filesystems): said once

__all__ = ["replacing", "write_bytes", "fsync_dir", "temporary_name", "unlink_quietly", "batched"]

# Directories inside which batched() is active: writes skip their fsyncs until the block ends.
_BATCHED: List[Path] = []


def temporary_name(path: Path, unique: bool) -> Path:
    """Where the bytes of `path` are written before the rename (see the module docstring)."""
    return Path(_part(os.fspath(path), unique))


def _part(path: str, unique: bool) -> str:
    head, name = os.path.split(path)
    return os.path.join(head, f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp" if unique else name + ".part")


@contextlib.contextmanager
def replacing(path: str | os.PathLike, unique: bool = True, sync_dir: bool = True,
              durable: bool = True) -> Iterator[BinaryIO]:
    """Yield a binary file; on a normal exit its bytes are fsynced and renamed to `path`.
    An exception inside the block (or in the fsync or rename) removes the temporary file and
    propagates; `path` is then untouched.
    """
    target = os.fspath(path)
    part, fd = _open_part(target, unique)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            _sync(fh.fileno(), durable)
        os.replace(part, target)
    except BaseException:
        unlink_quietly(part)
        raise
    _sync_parent(target, durable and sync_dir)


def _open_part(target: str, unique: bool) -> tuple[str, int]:
    """(the temporary name of `target`, a descriptor open for writing it)."""
    part = _part(target, unique)
    # mode 0o666 less the umask, like any new file (mkstemp's 0o600 is not)
    return part, os.open(part, os.O_WRONLY | os.O_CREAT | (os.O_EXCL if unique else os.O_TRUNC), 0o666)


def _sync(fd: int, durable: bool) -> None:
    if durable and not _BATCHED:  # inside batched(): one syncfs at its end instead
        os.fsync(fd)


def _sync_parent(target: str, sync_dir: bool) -> None:
    if sync_dir and not _BATCHED:
        fsync_dir(os.path.dirname(target) or ".")


@contextlib.contextmanager
def batched(directory: str | os.PathLike) -> Iterator[None]:
    """Many small files at once (a sweep's run directories): inside the block writes are atomic
    but not yet durable, and a normal exit makes them all durable with one syncfs of the file system
    that holds `directory` (one fsync per file costs a journal commit each)."""
    _BATCHED.append(Path(directory))
    try:
        yield
    finally:
        _BATCHED.pop()
    sync_filesystem(directory)


def sync_filesystem(directory: str | os.PathLike) -> None:
    """syncfs(2) of the file system holding `directory`; sync(2) where libc has no syncfs."""
    import ctypes

    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        syncfs = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)  # the C library already loaded
        if syncfs is None or syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def write_bytes(path: str | os.PathLike, data: bytes, unique: bool = True, sync_dir: bool = True,
                durable: bool = True) -> None:
    """Write `data` to `path` atomically: replacing()'s steps on a file descriptor (a sweep writes two
    files per point, and a file object and path objects cost more than the system calls). Creates
    the parent directory, only when the first open finds none."""
    target = os.fspath(path)
    try:
        part, fd = _open_part(target, unique)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        part, fd = _open_part(target, unique)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            _sync(fd, durable)
        finally:
            os.close(fd)
        os.replace(part, target)
    except BaseException:
        unlink_quietly(part)
        raise
    _sync_parent(target, durable and sync_dir)


def write_text(path: str | os.PathLike, text: str, **how: bool) -> None:
    """write_bytes of `text` in UTF-8."""
    write_bytes(path, text.encode(), **how)


def unlink_quietly(path: str | os.PathLike) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
