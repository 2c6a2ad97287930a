"""Shared filesystems (NFS, Lustre, GPFS, BeeGFS, CIFS): what hpc does differently there.

    python -m hpc.fs runs/            # the filesystem of a path, its mount options, what hpc does

Four things differ from a local disk, and each has one answer here:
  - mmap: a checkpoint mapped into memory on NFS turns a page fault after another node pruned
    the file into SIGBUS, a crash rather than an exception. mmap_ok() says no on a network
    filesystem, and loads read into memory instead (HPC_MMAP=0 or 1 overrides the detection).
  - polling: NFS caches a failed lookup of a name (a negative dentry, up to acdirmax, 30 to 60 s),
    so stat() of a file another node is about to write keeps failing after it exists. listed()
    reads the directory instead: reading it revalidates the directory and drops those entries.
  - directory fsync: some network and FUSE filesystems answer EINVAL or ENOTSUP. The rename is
    then as durable as the server makes it; fsync_dir() says so once and goes on.
  - locks: flock without lock support (NFSv3 without lockd, Lustre without -o flock) fails with
    ENOLCK or EOPNOTSUPP: lock_error() says that, not "no space". Lustre's localflock, NFS's nolock
    and local_lock=flock|all take the lock on this node only, excluding nothing on the others:
    local_locks() names such a mount, for a warning.
The filesystem is found in /proc/mounts (the longest mount point holding the path). Imports no
torch: the run directory's lock and hpc.status use it.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from pathlib import Path
from typing import NamedTuple

log = logging.getLogger(__name__)

MOUNTS = "/proc/mounts"
NETWORK_TYPES = frozenset({"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "ceph"})
# mount options under which flock excludes other processes of this node only
LOCAL_LOCK_OPTIONS = {"localflock": "Lustre's localflock", "nolock": "NFS's nolock",
                      "local_lock=flock": "NFS's local_lock=flock", "local_lock=all": "NFS's local_lock=all"}
NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})
NO_DIR_FSYNC = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP})
LOCK_HINT = ("HINT: mount NFS with lock support (NFSv4, or NFSv3 with rpc.statd running, not -o nolock) "
             "or Lustre with -o flock, or use a run directory on a filesystem with file locks")
_said: set[str] = set()  # messages logged once per process
_OCTAL = re.compile(r"\\([0-7]{3})")


class Mount(NamedTuple):
    point: str
    fstype: str
    options: tuple[str, ...]


def _unescape(field: str) -> str:
    """/proc/mounts writes space, tab, newline and backslash in paths as octal escapes (\\040)."""
    return _OCTAL.sub(lambda m: chr(int(m[1], 8)), field)


def parse_mounts(text: str) -> list[Mount]:
    """Mounts from /proc/mounts text ("device point type options 0 0" per line); odd lines skipped."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4:
            mounts.append(Mount(_unescape(fields[1]), fields[2], tuple(fields[3].split(","))))
    return mounts


def mount_of(path: str | os.PathLike, mounts: list[Mount] | None = None) -> Mount | None:
    """The mount holding `path` (or its nearest existing parent); None when /proc/mounts is unreadable."""
    if mounts is None:
        try:
            mounts = parse_mounts(Path(MOUNTS).read_text())
        except OSError:
            return None
    place = os.path.realpath(path)
    best = None
    for m in mounts:  # the last mount of the longest point wins: later mounts hide earlier ones
        inside = place == m.point or place.startswith(m.point.rstrip("/") + "/")
        if inside and (best is None or len(m.point) >= len(best.point)):
            best = m
    return best


def network(path: str | os.PathLike, mounts: list[Mount] | None = None) -> bool:
    m = mount_of(path, mounts)
    return m is not None and m.fstype.lower() in NETWORK_TYPES


def mmap_ok(path: str | os.PathLike, mounts: list[Mount] | None = None) -> bool:
    """Whether a checkpoint at `path` may be memory-mapped: not on a network filesystem."""
    forced = os.environ.get("HPC_MMAP", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return not network(path, mounts)


def listed(directory: str | os.PathLike) -> set[str]:
    """The names in `directory` ({} when it is missing). Poll with this, never with stat() or
    open() of a name that does not exist yet: NFS would answer from its negative lookup cache."""
    try:
        return set(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return set()


def once(message: str) -> None:
    """Log `message` as a warning the first time this process sees it."""
    if message not in _said:
        _said.add(message)
        log.warning("%s", message)


def fsync_dir(directory: str | os.PathLike) -> None:
    """fsync a directory; EINVAL or ENOTSUP means the filesystem does not do that (logged once)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in NO_DIR_FSYNC:
            raise
        m = mount_of(directory)
        where = f"{m.fstype} at {m.point}" if m else "this filesystem"
        once(f"fsync of a directory is not supported on {where} ({err.strerror}): renames there are as "
             "durable as the server makes them")
    finally:
        os.close(fd)


def lock_error(path: str | os.PathLike, err: OSError) -> str | None:
    """One line for a flock that failed because the filesystem has no locks; None for other errors."""
    if err.errno not in NO_LOCKS:
        return None
    m = mount_of(path)
    fs = f"{m.fstype} mounted at {m.point}" if m else "its filesystem"
    return (f"cannot lock {path}: {err.strerror} (errno {errno.errorcode.get(err.errno, err.errno)}) on {fs}; "
            f"expected a filesystem with file locks. {LOCK_HINT}")


def local_locks(path: str | os.PathLike, mounts: list[Mount] | None = None) -> str | None:
    """A warning when locks on `path`'s mount are taken on this node only; None otherwise."""
    m = mount_of(path, mounts)
    if m is None or m.fstype.lower() not in NETWORK_TYPES:
        return None
    found = [LOCAL_LOCK_OPTIONS[o] for o in m.options if o in LOCAL_LOCK_OPTIONS]
    if not found:
        return None
    return (f"{path} is on {m.fstype} mounted at {m.point} with {found[0]}: a lock there excludes "
            "processes of this node only, not those of other nodes. HINT: mount with -o flock (Lustre) "
            "or with lock support (NFS), or run every writer on one node")
