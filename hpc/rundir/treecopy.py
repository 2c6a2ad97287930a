"""A directory made whole or not at all, and files copied into it: the one copier of the code snapshot
(hpc.rundir.snapshot) and of hpc's copy for containers (hpc.container.carry).

    python -c "from hpc.rundir import treecopy; print(treecopy.make('/tmp/x', lambda d: treecopy.copy_files(d, {'h': ('/etc/hostname', 0o644)}), 'copy'))"

make() writes the directory into a temporary sibling, `.tmp-<host>-<pid>-<random>`, made first (so
an empty tree is an empty directory), and renames it to its final name whole: a reader finds the
final name complete or absent, never half-made. A failure or an interrupt removes the temporary.
A kill (SIGKILL, an OOM kill, a node lost) cannot: the temporary stays, unused, until the next make()
in the same parent removes every temporary of a process that is gone (this host's, whose pid no
longer runs) or older than STALE_S (another host's, whose pid cannot be checked from here). So no
`.tmp-*` outlives the next snapshot (or copy) into the same folder.

copy_files() copies files read-only (executable bits kept), a symlink as a symlink, each read once
and hashed as it is copied; threads, since the time goes to creating files, which releases the GIL.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import socket
import stat
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, Mapping, Tuple, TypeVar, Union

T = TypeVar("T")
PREFIX = ".tmp-"
STALE_S = 86400.0  # another host's temporary this old belongs to a process that died
COPY_THREADS = 8


def make(parent: Union[str, Path], fill: Callable[[Path], T], name: Union[str, Callable[[T], str]]
         ) -> Tuple[Path, T, bool]:
    """(final path, what fill returned, whether this call made it): `fill(tmp)` writes into an empty
    temporary directory under `parent`, renamed to `name` (or name(result)). A final directory there
    already (the same content made before, or by another process meanwhile) is kept, the temporary
    dropped, and made is False: the caller checks that it is complete."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    drop_stale(parent)
    tmp = parent / f"{PREFIX}{_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        result = fill(tmp)
        final = parent / (name if isinstance(name, str) else name(result))
        try:
            os.rename(tmp, final)
            return final, result, True
        except OSError:  # made before: keep that one (refused below if it is no directory)
            if not final.is_dir():
                raise
            return final, result, False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def drop_stale(parent: Path) -> None:
    """Remove the temporaries of processes that died mid-copy (best effort; see the module docstring)."""
    try:
        names = [n for n in os.listdir(parent) if n.startswith(PREFIX)]
    except OSError:
        return
    for name in names:
        path = parent / name
        try:
            host, pid = _owner(name)
            if (host == _host() and not _alive(pid)) or time.time() - path.stat().st_mtime > STALE_S:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def _host() -> str:
    return socket.gethostname().replace("-", "_") or "host"


def _owner(name: str) -> Tuple[str, int]:
    """(host, pid) of a temporary's name; ('', 0) for one of another form (an older hpc's)."""
    parts = name[len(PREFIX):].split("-")
    return (parts[0], int(parts[1])) if len(parts) == 3 and parts[1].isdigit() else ("", 0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return pid > 0


def copy_files(dest: Union[str, Path], files: Mapping[str, Tuple[str, int]]) -> Dict[str, str]:
    """Copy each `relative path -> (source, st_mode)` into dest; returns relative path -> content
    digest (digest()). A mode that is a symlink's copies the link itself."""
    from concurrent.futures import ThreadPoolExecutor  # a copy only: a reused or linked snapshot never loads it

    dest = str(dest)
    for parent in sorted({dest, *(os.path.dirname(os.path.join(dest, rel)) for rel in files)}):
        os.makedirs(parent, exist_ok=True)
    with ThreadPoolExecutor(COPY_THREADS) as pool:
        return dict(pool.map(lambda rel: (rel, copy_one(*files[rel], os.path.join(dest, rel))), sorted(files)))


def copy_one(src: str, mode: int, dst: str) -> str:
    """One file, read-only (its executable bits kept), or one symlink; returns its digest."""
    if stat.S_ISLNK(mode):
        target = os.readlink(src)
        os.symlink(target, dst)
        return digest(os.fsencode(target), link=True)
    with open(src, "rb") as fh:
        data = fh.read()
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o555 if mode & 0o111 else 0o444)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return digest(data)


def digest(data: bytes, link: bool = False) -> str:
    """A file's content digest; a symlink's is that of its target, marked as a link."""
    return hashlib.sha256(b"link\0" + data if link else data).hexdigest()
