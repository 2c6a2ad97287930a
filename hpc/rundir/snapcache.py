"""Reuse of a code snapshot across run directories: hard links to an earlier snapshot's copy.

    python -m hpc.submit langsplat --run-dir runs/a     # copies the code into runs/a/code/<hash>/
    python -m hpc.submit langsplat --run-dir runs/b     # same files: links runs/b/code/<hash>/ to it

hpc.rundir.snapshot copies the live tree into each new run directory. When the live files all still
have the stat an earlier snapshot of the same tree listed, and the racy ones their content too (the
shortcut hpc.rundir.snapshot uses within one run directory: hpc.rundir.codefiles.unchanged), the new
run directory gets hard links to that earlier copy instead: nothing but the racy files is read or
hashed again. The links join two snapshots, never a snapshot and the live tree:
snapshot files are read-only copies nobody edits, and removing either run directory leaves the
other's files in place. Where linking fails (another file system, a copy that is gone), the files
are copied as usual.

The newest snapshot of each tree is named in the user's cache (hpc.fs.usercache: $HPC_CACHE_DIR,
else $XDG_CACHE_HOME/hpc, else ~/.cache/hpc), as snapshots/<digest of the tree's path>.json; a cache that
cannot be written only costs the next submission a copy.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from hpc.fs.atomic import write_bytes
from hpc.fs.usercache import cache_dir

Stat = Tuple[int, int, str, int, int, int]  # hpc.rundir.snapshot.Stat


def _entry(root: Path) -> Path:
    return cache_dir() / "snapshots" / f"{hashlib.sha256(str(root).encode(errors='surrogateescape')).hexdigest()[:16]}.json"


def remember(root: Path, snapshot_dir: Path) -> None:
    """Name `snapshot_dir` as the newest snapshot of the tree at `root` (best effort).

    Atomic but not fsynced: an entry lost or torn by a crash costs the next submission a copy,
    which is what reading it does about an unreadable one, and a submission need not wait for the
    disk (two fsyncs) for a cache."""
    path = _entry(root)
    try:
        write_bytes(path, json.dumps({"root": str(root), "dir": str(snapshot_dir)}).encode(), durable=False)
    except OSError:
        pass


def link_earlier(root: Path, dest: Path, files: Mapping[str, os.stat_result],
                 unchanged: Any) -> Optional[Dict[str, Stat]]:
    """Hard-link the newest earlier snapshot of `root` into `dest` when `unchanged(table, files)`
    holds for its listing; returns the listing's stats, or None (dest then holds nothing) when
    there is none, a file changed, or a link fails."""
    try:
        entry = json.loads(_entry(root).read_text())
        earlier = Path(entry["dir"])
        table = json.loads(Path(f"{earlier}.json").read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(table, dict) or table.get("root") != str(root) or not isinstance(table.get("files"), dict) \
            or not unchanged(table, files):
        return None
    stats = {rel: tuple(table["files"][rel]) for rel in sorted(files)}
    # Plain strings joined by hand, not Path objects nor os.path.join (the relative paths are git's or
    # os.walk's, never absolute): per file, the joins cost as much as the link.
    src_root, dst_root = f"{earlier}/", f"{dest}/"
    try:
        for parent in directories(files):  # dest exists; each parent before its children
            os.mkdir(dst_root + parent)
        for rel in files:
            src, dst = src_root + rel, dst_root + rel
            st = os.lstat(src)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(src), dst)
                continue
            if st.st_size != stats[rel][0]:  # not the copy its listing describes
                return _clear(dest)
            os.link(src, dst)
    except OSError:
        return _clear(dest)
    return stats  # type: ignore[return-value]


def directories(rels: Iterable[str]) -> List[str]:
    """Every directory the relative paths lie in, their ancestors included, each after its parent."""
    found: Set[str] = set()
    for rel in rels:
        cut = rel.rfind("/")
        while cut > 0 and rel[:cut] not in found:
            found.add(rel[:cut])
            cut = rel.rfind("/", 0, cut)
    return sorted(found)  # a parent is a prefix of its children: it sorts first


def _clear(dest: Path) -> None:
    import shutil

    shutil.rmtree(dest, ignore_errors=True)
    return None
