"""Each rank's list of its own files in a checkpoint, committed beside them; the marker names the lists.

    info = write(tmp, 3, {"rank-3.pt": {...}, "__3_0.distcp": {..., "items": [...]}})  # rank 3's save
    files = Files(step_dir, marker["files"], layout.rank_of)   # a load: what the marker lists ...
    problem = files.add(3)             # ... and rank 3's files, from its list checked against the marker

Why: a shard's checksum info holds one crc32 per stored tensor (hpc.checkpoint.checksums.ranges_info),
so a marker listing every rank's files grew with ranks x tensors (4.7 MB at 512 ranks of 300
tensors): rank 0 parsed every rank's report and wrote it all at each commit, and every rank parsed
all of it at each resume. Each rank now writes its own list (files-R.json); its report to rank 0
carries only that list's crc32 and size, and the marker lists the lists: a few tens of bytes per
rank. A load reads the marker and its own rank's list; another rank's list only when it reads
that rank's files (a DDP or resharded load, hpc.checkpoint.dcp_reader), each list once.

A list is checked against the marker's crc32 and size on the bytes read to parse it; a missing,
truncated or corrupted list makes the checkpoint fail verification like any other file of the rank.
Markers written before the lists name every file themselves, and load as they did.
"""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path
from typing import Any, Callable

from hpc.checkpoint.checksums import checksum_info, read_checked
from hpc.fs.atomic import write_bytes

__all__ = ["name", "rank_of_list", "write", "Files"]

_NAME = re.compile(r"^files-(\d+)\.json$")


def name(rank: int) -> str:
    """The list of a rank's files (layout.rank_of reads it back as that rank's)."""
    return f"files-{rank}.json"


def rank_of_list(file_name: str) -> int | None:
    m = _NAME.match(file_name)
    return int(m.group(1)) if m else None


def write(directory: Path, rank: int, files: dict[str, Any]) -> dict[str, Any]:
    """Write the list `files` (name -> checksum info) of `rank` into `directory`, atomically and
    fsynced as the rank's other files (the directory is fsynced once, at the commit's rename);
    return its checksum info, taken from the bytes written: nothing is read back."""
    data = json.dumps(files).encode()  # compact: json's C encoder runs only without indent
    write_bytes(Path(directory) / name(rank), data, unique=False, sync_dir=False)
    return {"crc32": f"{zlib.crc32(data):08x}", "bytes": len(data)}


class Files(dict):
    """name -> checksum info of a checkpoint's files: its marker's entries, and those of the ranks'
    lists read in so far (add). A name that both list is the marker's: the marker is what the checks start from.
    `owner` maps a file name to its rank (layout.rank_of): a list names only its rank's files."""

    def __init__(self, directory: Path, files: dict[str, Any], owner: Callable[[str], int | None]) -> None:
        super().__init__(files)
        self.directory, self.owner = Path(directory), owner
        self.lists_read: set[int] = set(getattr(files, "lists_read", ()))  # a copy reads none again

    def ranks(self) -> list[int]:
        """The ranks whose lists the marker names (none in a marker from before the lists)."""
        return sorted(r for r in map(rank_of_list, self) if r is not None)

    def add(self, rank: int) -> str:
        """Read `rank`'s list in, once: '' when it matches the marker's entry for it (or the marker
        names none), else what is wrong with it, in the words verification uses for any file."""
        list_name = name(rank)
        expected = self.get(list_name)
        if rank in self.lists_read or expected is None:
            return ""
        if not checksum_info(expected):
            return f"marker entry for {list_name} is malformed"
        data, problem = read_checked(self.directory / list_name, expected)
        if problem:
            return problem
        try:
            listed = json.loads(data)
        except ValueError as err:
            return f"{list_name} is unreadable ({err})"
        problem = self._malformed(rank, list_name, listed)
        if problem:
            return problem
        for n, info in listed.items():
            self.setdefault(n, info)
        self.lists_read.add(rank)
        return ""

    def _malformed(self, rank: int, list_name: str, listed: Any) -> str:
        """What makes a list that matches its checksum unusable: only a writer's bug does that."""
        if not isinstance(listed, dict):
            return f"{list_name} holds {json.dumps(listed)[:40]}, expected an object"
        for n, info in listed.items():
            if n == list_name or self.owner(n) != rank:
                return f"{list_name} lists {n!r}, not a file of rank {rank}"
            if not checksum_info(info):
                return f"{list_name}'s entry for {n} is malformed"
        return ""

