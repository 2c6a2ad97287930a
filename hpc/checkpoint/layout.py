"""What the entries of a checkpoint store directory are, which are complete, and how they go away.

    python -c "from hpc.checkpoint.layout import scan; print(scan('runs/x/rgb/checkpoints'))"

Names (anything else in the directory is ignored)::

    step-N/            committed; it counts only if its marker verifies (check)
    .step-N.tmp/       being written; with a marker it is committed, its rename still to come
    .step-N.old/       the earlier copy of step N while a re-save swaps the two (two renames)
    .step-N.invalid/   set aside by the writer: it failed verification
    .step-N.gone/      being deleted: renamed first, so no reader meets half a checkpoint

Every change of a name is one rename inside the directory, which readers see whole. A marker is
JSON written last; everything read from disk here is treated as untrusted input: a malformed
entry is reported as a problem, never raised.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from hpc.checkpoint import rank_lists
from hpc.checkpoint.checksums import checksum_info, verify

MARKER = "COMPLETE.json"
SHARED = "shared.pt"
KINDS = ("step", "tmp", "old", "invalid", "gone")
_ENTRY = re.compile(r"^(?:step-(\d+)|\.step-(\d+)\.(tmp|old|invalid|gone))$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$")  # a marker lists plain names, no paths
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index of a sharded save: the one dot name


def name(kind: str, step: int) -> str:
    return f"step-{step}" if kind == "step" else f".step-{step}.{kind}"


def scan(directory: str | os.PathLike) -> dict[str, dict[int, Path]]:
    """kind -> {step: path} of the entries present now (missing directory: all empty)."""
    found: dict[str, dict[int, Path]] = {k: {} for k in KINDS}
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return found
    for n in names:
        m = _ENTRY.match(n)
        if m:
            kind = m.group(3) or "step"
            found[kind][int(m.group(1) or m.group(2))] = Path(directory) / n
    return found


def identity(path: Path) -> tuple[int, int] | None:
    """(inode, marker mtime or 0) of an entry, None when it is gone: it changes when a rename puts
    another directory there."""
    try:
        ino = os.lstat(path).st_ino
    except OSError:
        return None
    try:
        return ino, os.stat(path / MARKER).st_mtime_ns
    except OSError:
        return ino, 0


def read_marker(path: Path) -> tuple[str, dict]:
    """('', marker) or (what is wrong, {})."""
    try:
        raw = (path / MARKER).read_bytes()
    except FileNotFoundError:
        return "no completion marker", {}
    except NotADirectoryError:
        return "a file, not a checkpoint directory", {}
    except IsADirectoryError:
        return f"{MARKER} is a directory, not a marker", {}
    except OSError as err:
        return f"unreadable completion marker ({err.strerror})", {}
    try:
        marker = json.loads(raw)
    except ValueError as err:
        return f"unreadable completion marker ({err})", {}
    return _marker_problem(marker, path), (marker if isinstance(marker, dict) else {})


def _marker_problem(marker: object, path: Path) -> str:
    if not isinstance(marker, dict):
        return f"completion marker holds {json.dumps(marker)[:40]}, expected an object"
    files = marker.get("files")
    if not isinstance(files, dict):
        return "completion marker has no file list"
    if SHARED not in files:  # checked before any file is read: a marker that cannot load
        return f"marker lists no {SHARED}"
    for n, info in files.items():
        if not (_FILE_NAME.match(n) or n == DCP_METADATA):
            return f"marker lists {n!r}, not a plain file name"
        if not (isinstance(info, str) or checksum_info(info)):
            return f"marker entry for {n} is malformed"
    step, m = marker.get("step"), _ENTRY.match(path.name)
    if m and isinstance(step, int) and step != int(m.group(1) or m.group(2)):
        return f"marker is for step {step}"
    return ""


def check(path: Path, crc: Any = None, rank: int | None = None) -> tuple[str, dict[str, Any]]:
    """('', the marker's files: name -> checksum info) when the entry at `path` is complete and
    intact, else (problem, {}). Where the marker names the ranks' lists of their files
    (hpc.checkpoint.rank_lists), those read in (`rank`'s, or all) are part of it and of the check.

    Every listed file must exist with the size the marker gives (a stat, nothing read). `crc`:
    names whose checksums are verified too (None: all). `rank`: only the shared files and that
    rank's own are looked at; the other ranks' files are not even stat'ed (at 512 ranks that
    was a thousand metadata operations per rank at every resume, half a million per restart).
    Those a rank's load reads (shards of a resharded load, other ranks' parts under DDP) are
    checked against the marker as they are read (dcp_reader), a missing one fails that load;
    the ranks then agree in one collective, so a corrupt file makes all ranks skip the
    checkpoint alike (TrainLoop.resume).
    """
    problem, marker = read_marker(path)
    if problem:
        return problem, {}
    files = rank_lists.Files(path, marker["files"], rank_of)
    for r in files.ranks() if rank is None else [rank]:  # a list is checked as it is read
        problem = files.add(r)
        if problem:
            return problem, {}
    for n, expected in list(files.items()):
        if (rank is not None and rank_of(n) not in (None, rank)) or rank_lists.rank_of_list(n) in files.lists_read:
            continue  # another rank's file (its load checks it), or a list checked as it was read
        problem = verify(path / n, expected) if crc is None or n in crc else sized(path / n, expected)
        if problem:
            return problem, {}
    return "", files


def sized(path: Path, expected: Any) -> str:
    """'' when `path` exists with the marker's byte count (legacy entries: exists), else why not."""
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return f"{path.name} is missing"
    except OSError as err:
        return f"{path.name} is unreadable ({err.strerror})"
    want = expected.get("bytes") if isinstance(expected, dict) else size
    return "" if size == want else f"{path.name} has {size} bytes, the marker says {want} (truncated)"


def marker_files(path: Path) -> dict:
    """name -> checksum info of the files a valid entry's marker lists ({} when unreadable)."""
    return read_marker(path)[1].get("files", {})


def remove(path: Path) -> None:
    """Delete an entry so that readers see it whole or not at all: rename to .gone, then delete."""
    m = _ENTRY.match(path.name)
    gone = path.with_name(name("gone", int(m.group(1) or m.group(2)))) if m else path
    if gone != path:
        discard(gone)
        try:
            os.replace(path, gone)
        except FileNotFoundError:
            return
    discard(gone)


def discard(path: Path) -> None:
    """Delete whatever is at `path` (directory or file); nothing there is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except (FileNotFoundError, IsADirectoryError):
            pass


def set_aside(path: Path, step: int) -> Path:
    """Move a committed entry that failed verification out of the way, as .step-N.invalid."""
    target = path.with_name(name("invalid", step))
    discard(target)
    os.replace(path, target)
    return target


# One rank's files in a checkpoint's directory: its state, the list of its files (rank_lists), its
# report to rank 0, and what DCP writes under its name in a save without collectives (data files
# __R_K.distcp, its index __R.metadata, dcp_index.rank_metadata). Every name a rank's file is given
# is formatted here or by DCP, and rank_of reads them all back: tests check it against the names a
# real save writes.
_RANK_FILE = re.compile(r"^(?:__(\d+)(?:_\d+\.distcp|\.metadata)|rank-(\d+)\.(?:pt|done))$")
rank_list = rank_lists.name  # the list of the rank's files, its crc32s included: the marker names it


def rank_state(rank: int) -> str:
    """The rank's own state (RNG states, data position): read back by that rank alone."""
    return f"rank-{rank}.pt"


def rank_report(rank: int) -> str:
    """What the rank tells rank 0 it wrote (hpc.checkpoint.reports); never committed as data."""
    return f"rank-{rank}.done"


def rank_of(file_name: str) -> int | None:
    """The rank a file of a checkpoint's directory belongs to; None for shared files and others."""
    m = _RANK_FILE.match(file_name)
    return int(m.group(1) or m.group(2)) if m else rank_lists.rank_of_list(file_name)


def drop_unlisted(directory: Path, listed: Any) -> None:
    """Delete the ranks' files in a checkpoint being committed that its marker does not list,
    itself or in a rank's list (a rank whose list `listed` names keeps its files: rank 0 commits
    without reading the lists).

    One kind is the commit's alone: each rank's report to rank 0 (rank_report). Kept, it would be
    a file per rank that nothing reads, on filesystems where the metadata server is what runs out
    first (DCP's index of each rank's part, __R.metadata, is listed: loads read it). The other
    kind are the files of ranks >= the world size: a save stopped by a kill leaves its .step-N.tmp
    behind, and a requeued job that came back on fewer ranks (an elastic restart) saves step N
    into it again; no report lists those, yet committed with the rest they would hold their
    share of the disk until the step is pruned. Called before the marker is written: a kill
    midway leaves a directory without a marker, which never counts, and the requeued job's save
    writes it again."""
    with os.scandir(directory) as entries:
        for entry in entries:
            rank = rank_of(entry.name)
            if rank is None or entry.name in listed:
                continue
            if rank_list(rank) not in listed or entry.name == rank_report(rank):
                discard(Path(entry.path))
