"""Reading a checkpoint store: the newest complete and valid checkpoint, safe while a writer prunes.

    reader = StoreReader("run/stage/checkpoints", rank=0)
    state = reader.load()          # newest valid checkpoint's state, or None
    reader.latest()                # its step, nothing loaded

CheckpointStore (hpc.checkpoint.store) is a StoreReader that also writes. Readers take no lock: a
checkpoint renamed or deleted by the writer under a read is noticed (its inode or marker changed)
and the read starts over from a fresh listing, so a result is always one complete checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any, Iterator

from hpc.checkpoint import layout, rank_lists, read_lease
from hpc.checkpoint.dcp_index import parts_in
from hpc.checkpoint.files import load_file
from hpc.checkpoint.layout import DCP_METADATA, MARKER, SHARED

log = logging.getLogger(__name__)

PER_RANK_KEY = "per_rank"
# load() puts the directory of a checkpoint holding DCP shards under this key (hpc.checkpoint.dcp_engine loads them)
SHARDED_KEY = "sharded_dir"
# ... and its marker's files (name -> checksums) under this one: DcpEngine.load(files=...) checks
# what it reads against them, without reading the marker a second time
FILES_KEY = "marker_files"
# A read whose checkpoint the writer replaced meanwhile starts over; this many times at most.
READ_ATTEMPTS = 100
SETTLE_ATTEMPTS = 40  # reading(): 50 ms apart
_RACED = object()  # a read met a rename or deletion by the writer: scan again


class StoreReader:
    """Loads checkpoints of `directory` for `rank` (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike, rank: int = 0) -> None:
        self.directory = Path(directory)
        self.rank = rank
        self._checked: dict[tuple, str] = {}  # (step, inode, marker mtime) -> problem ('' = valid)
        # names whose checksums a load verifies, None: every file (a reader on its own: an
        # evaluation job). A rank of a training job verifies only what it reads (CheckpointStore).
        self.crc: set[str] | None = None
        # None: a load checks every file the marker lists; a rank: only the shared ones and its own
        self.scope: int | None = None

    def steps(self) -> list[int]:
        """Steps of committed entries (valid or not), oldest first."""
        return sorted(layout.scan(self.directory)["step"])

    def latest(self) -> int | None:
        """Newest step whose checkpoint is complete and passes its checksums (nothing loaded)."""
        return self._walk(None, lambda path, names: True, warn=False)[0]

    def load(self, step: int | None = None, map_location: Any = "cpu") -> dict[str, Any] | None:
        """State of `step`, or of the newest valid checkpoint; None when there is none.

        Incomplete or corrupted checkpoints are skipped with a warning that names them. The
        returned dict holds this rank's own ``per_rank`` entry (None if it saved none). Safe
        while a writer saves and prunes: a checkpoint renamed or deleted under a read is read
        again from a fresh listing, so the result is always one complete checkpoint.
        """
        return self._walk(step, lambda path, names: self._read(path, names, map_location), warn=True)[1]

    @contextlib.contextmanager
    def reading(self, step: int | None = None, map_location: Any = "cpu") -> Iterator[dict[str, Any] | None]:
        """load() under a read lease (hpc.checkpoint.read_lease): the checkpoint whose state is
        yielded is not pruned before the block ends, so its DCP shards (``state[SHARDED_KEY]``)
        can be read inside it. None when there is no valid checkpoint."""
        for _ in range(READ_ATTEMPTS):  # all candidates pruned between listing and lease: list again
            candidates = [step] if step is not None else sorted(self.candidates(), reverse=True)
            for s in candidates:
                with read_lease.shared(self.directory, s):
                    state = self._settled(s, map_location)
                    if state is not None:
                        yield state
                        return
                if s not in self.candidates():  # pruned meanwhile: its lease file would stay for good
                    read_lease.drop(self.directory, s)
            if step is not None or not candidates:
                break
        yield None

    def _settled(self, step: int, map_location: Any) -> dict[str, Any] | None:
        """load(step), waiting a moment for a committed .step-N.tmp to get its final name: the
        shards are read by path after this returns, and the writer's rename would move them."""
        for _ in range(SETTLE_ATTEMPTS):
            state = self.load(step, map_location)
            where = state.get(SHARDED_KEY) if state else None
            if where is None or where.name == layout.name("step", step):
                return state
            time.sleep(0.05)
        return state  # a writer killed before its rename: nothing moves it any more

    def candidates(self) -> set[int]:
        """Steps that may hold a checkpoint (committed, or with a commit still to finish)."""
        found = layout.scan(self.directory)
        return set(found["step"]) | set(found["tmp"]) | set(found["old"])

    def _walk(self, step: int | None, read: Any, warn: bool) -> tuple[int | None, Any]:
        for _ in range(READ_ATTEMPTS):
            result = self._walk_once(step, read, warn)
            if result is not _RACED:
                return result
        raise RuntimeError(
            f"every one of {READ_ATTEMPTS} reads of {self.directory} met a checkpoint being replaced. "
            "HINT: keep=2 or more leaves readers a complete checkpoint while the next is written.")

    def _walk_once(self, step: int | None, read: Any, warn: bool) -> Any:
        found = layout.scan(self.directory)
        steps = sorted(set(found["step"]) | set(found["tmp"]) | set(found["old"]), reverse=True)
        for s in steps if step is None else [step]:
            for kind in ("step", "tmp", "old"):
                path = found[kind].get(s)
                if path is None or (kind == "old" and s in found["step"]):
                    continue
                if kind != "step" and not os.path.lexists(path / MARKER):
                    if warn and kind == "tmp":
                        warn_user(f"skipping incomplete checkpoint {path} (no completion marker: its "
                              "write was interrupted, or is still running)")
                    continue
                result = self._attempt(path, read)
                if result is _RACED:
                    return _RACED
                problem, value = result
                if problem:
                    warn_user(f"skipping checkpoint {path}: {problem}") if warn else None
                    continue
                if warn and kind != "step":
                    warn_user(f"loaded checkpoint step {s} from {path}: complete, but the writer was "
                          f"stopped before renaming it to step-{s}; its next save does that")
                return s, value
        return None, None

    def _attempt(self, path: Path, read: Any) -> Any:
        """(problem, value) of reading one entry, or _RACED when the writer renamed or deleted it
        meanwhile (its inode or marker changed): such a problem is the writer's, not the disk's."""
        before = layout.identity(path)
        if before is None:
            return _RACED
        problem, names = layout.check(path, self.crc, self.scope)
        value = None
        if not problem:
            try:
                value = read(path, names)
            except Exception as err:
                # torch.load reports a file deleted under it as a RuntimeError, not an OSError
                if layout.identity(path) != before:
                    return _RACED
                if not isinstance(err, (FileNotFoundError, NotADirectoryError)):
                    raise
                problem = f"{Path(err.filename or path).name} is missing"
            if isinstance(value, str):
                problem, value = value, None
        if layout.identity(path) != before:
            return _RACED
        return problem, value

    def _read(self, path: Path, names: dict[str, Any], map_location: Any) -> dict[str, Any] | str:
        state = load_file(path / SHARED, map_location)
        if not isinstance(state, dict):
            return f"{SHARED} holds a {type(state).__name__}, not a checkpoint's dict"
        own = layout.rank_state(self.rank)
        state[PER_RANK_KEY] = load_file(path / own, map_location) if own in names else None
        sharded = DCP_METADATA in names or bool(parts_in(names))  # merged, or in the ranks' parts
        lists = names.ranks() if isinstance(names, rank_lists.Files) else []
        if not sharded and lists and self.rank not in names.lists_read:
            # A rank the save had not (a resume on more ranks) learns whether DCP's index is in the
            # ranks' parts from the first rank's list, which its load reads first (dcp_reader).
            problem = names.add(lists[0])
            if problem:
                return problem
            sharded = bool(parts_in(names))
        if sharded:
            state[SHARDED_KEY], state[FILES_KEY] = path, names
        return state

    def _problem(self, step: int, path: Path, known: str | None = None) -> str:
        """What is wrong with step-N ('' if valid), checked once per directory and marker. Its
        marker and file sizes are trusted, nothing is read: the writer checksummed every file
        while writing it, and a load verifies what it reads."""
        ident = layout.identity(path)
        key = (step, *ident) if ident else None
        if known is not None:
            if key:
                self._checked[key] = known
            return known
        if key in self._checked:
            return self._checked[key]
        problem = layout.check(path, crc=())[0]
        if key:
            self._checked[key] = problem
        return problem


def warn_user(message: str) -> None:
    log.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
