"""How a live code tree differs from a snapshot's listing, and hpc.status's line about it.

    python -m hpc.status RUN      # "code: snapshot <hash> of <tree>: the live code matches it", or what differs

The snapshot (hpc.rundir.snapshot) keeps a listing beside each copy: each file's size, mtime, ctime,
inode and digest (hpc.rundir.codefiles). Only files that are not clean by their stat are read and
hashed again. A submission never loads this module.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Tuple

from hpc.rundir.codefiles import SnapshotError, Source, clean, content, listing, load_table, same_stat


@dataclass(frozen=True)
class Drift:
    """How the live tree differs from a snapshot (all empty: it does not)."""

    changed: Tuple[str, ...]
    added: Tuple[str, ...]
    removed: Tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.changed or self.added or self.removed)

    def summary(self, n: int = 3) -> str:
        parts = []
        for what, paths in (("changed", self.changed), ("added", self.added), ("removed", self.removed)):
            if paths:
                parts.append(f"{len(paths)} {what} ({', '.join(paths[:n])}{' ...' if len(paths) > n else ''})")
        return "; ".join(parts)


def drift(table: Mapping[str, Any]) -> Drift:
    """Compare the live tree with a snapshot's listing: only files that are not clean by their stat
    are read and hashed."""
    source = Source(Path(table["root"]), bool(table["git"]), tuple(table.get("exclude", ())))
    files, _ = listing(source)
    listed = table["files"]
    listed_ns = table.get("listed_ns")
    changed = []
    for rel in sorted(files.keys() & listed.keys()):
        st, entry = files[rel], listed[rel]
        if clean(entry, st, listed_ns) if isinstance(listed_ns, int) else same_stat(entry, st):
            continue  # a listing made before ctimes were kept: compared by size and mtime as then
        if content(source.root, rel, st) != entry[2]:
            changed.append(rel)
    return Drift(tuple(changed), tuple(sorted(files.keys() - listed.keys())),
                 tuple(sorted(listed.keys() - files.keys())))


def status_line(record: Optional[Mapping[str, Any]]) -> str:
    """hpc.status's line about the code: which snapshot the jobs run, and whether the live code
    still matches it."""
    if not record:
        return "code: no snapshot (run.snapshot=false, or submitted before snapshots): the jobs run the live tree"
    listing_path = Path(f"{record['dir']}.json")  # <code>/<hash>.json, beside the copy
    table = load_table(listing_path)
    where = f"code: snapshot {record['hash']} of {record['root']}"
    if table is None:
        return f"{where}: its listing {listing_path} is missing, so the live code is not compared"
    if not Path(table["root"]).is_dir():
        return f"{where}: the live tree is gone"
    try:
        found = drift(table)
    except (SnapshotError, OSError) as err:
        return f"{where}: the live code could not be compared ({err})"
    if not found:
        return f"{where}: the live code matches it"
    return (f"{where}: the live code differs ({found.summary()}); the jobs of this run import the snapshot, "
            "a resubmission snapshots the live code")
