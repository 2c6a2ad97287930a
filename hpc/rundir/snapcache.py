"""The snapshot store of a run root, and reuse of a snapshot across run directories and roots.

    python -m hpc.submit langsplat --run-dir runs/a   # copies the code into runs/.hpc-snapshots/<hash>/
    python -m hpc.submit langsplat --run-dir runs/b   # same files: runs/b's jobs run that same copy
    python -m hpc.submit langsplat --run-dir other/c  # another root: other/.hpc-snapshots/<hash>/, hard links

hpc.rundir.snapshot keeps its copies in the store of the run directory's parent, the run root:
<root>/.hpc-snapshots/<hash>/, named by their content, with a listing beside each (<hash>.json). A
run directory keeps no copy of its own: its manifest names the snapshot its jobs run. When the live
files all still have the stat the newest snapshot of the same tree listed, and the racy ones their
content too (hpc.rundir.codefiles.unchanged), a new run directory under the same root runs that
snapshot as it is, and one under another root gets hard links to it in its own root's store:
nothing but the racy files is read or hashed again. The links join two snapshots, never a snapshot
and the live tree: snapshot files are read-only copies nobody edits. Where linking fails (another
file system, a copy that is gone), the files are copied as usual.

The newest snapshot of each tree is named in the user's cache (hpc.fs.usercache: $HPC_CACHE_DIR,
else $XDG_CACHE_HOME/hpc, else ~/.cache/hpc), as snapshots/<digest of the tree's path>.json; a cache
that cannot be written only costs the next submission a look at its store or a copy.

A store keeps every snapshot made in it: removing a run directory leaves its snapshot, which other
runs of the root may run. Remove <root>/.hpc-snapshots/ when no job of that root is queued or running.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Set, Tuple, Union

from hpc.fs.atomic import write_bytes
from hpc.fs.usercache import cache_dir

Stat = Tuple[int, int, str, int, int, int]  # hpc.rundir.snapshot.Stat
STORE = ".hpc-snapshots"  # <run root>/.hpc-snapshots/<hash>/: never code itself (hpc.rundir.codefiles)


def store_of(where: Union[str, Path]) -> Path:
    """The store of a run (or sweep) directory: in its parent, the run root."""
    return Path(os.path.abspath(where)).parent / STORE


def _entry(root: Path) -> Path:
    return cache_dir() / "snapshots" / f"{hashlib.sha256(str(root).encode(errors='surrogateescape')).hexdigest()[:16]}.json"


def remember(root: Path, snapshot_dir: Path) -> None:
    """Name `snapshot_dir` as the newest snapshot of the tree at `root` (best effort).

    Atomic but not fsynced: an entry lost or torn by a crash costs the next submission a look at its
    store or a copy, which is what reading it does about an unreadable one, and a submission need
    not wait for the disk (two fsyncs) for a cache."""
    path = _entry(root)
    try:
        write_bytes(path, json.dumps({"root": str(root), "dir": str(snapshot_dir)}).encode(), durable=False)
    except OSError:
        pass


def newest(root: Path, store: Path) -> Optional[Tuple[Path, Dict[str, Any]]]:
    """(directory, listing) of the newest snapshot of the tree at `root`: the one the user's cache
    names, else the newest listing of that tree in `store`; None when there is none."""
    try:
        entry = json.loads(_entry(root).read_text())
        found: Optional[Path] = Path(entry["dir"])
    except (OSError, ValueError, KeyError, TypeError):
        listings = sorted(store.glob("*.json"), key=_mtime) if store.is_dir() else []
        found = listings[-1].with_suffix("") if listings else None
    table = _table(found) if found else None
    if table is None or table.get("root") != str(root):
        return None
    return found, table  # type: ignore[return-value]


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _table(snapshot_dir: Path) -> Optional[Dict[str, Any]]:
    try:
        table = json.loads(Path(f"{snapshot_dir}.json").read_text())
    except (OSError, ValueError):
        return None
    return table if isinstance(table, dict) and isinstance(table.get("files"), dict) else None


def link(earlier: Path, table: Mapping[str, Any], dest: Path,
         files: Mapping[str, os.stat_result]) -> Optional[Dict[str, Stat]]:
    """Hard-link the snapshot at `earlier` (whose listing is `table`, found unchanged) into `dest`;
    returns the listing's stats, or None (dest then holds nothing) when a link fails or a copy is
    not the one its listing describes."""
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
