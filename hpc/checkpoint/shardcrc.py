"""Checksums of DCP's data files taken as they are written, so that a commit need not read them back.

    dcp.save(state, checkpoint_id=d, storage_writer=shardcrc.writer(d))
    runs = shardcrc.written(d / "__0_0.distcp")    # {(offset, length): "crc32"}, or None
    files = shardcrc.own_shards(d, rank)           # this rank's files' checksum info, for its list

The rank's list of its files (rank_lists) holds one crc32 per stored item of its data file
(hpc.checkpoint.checksums.ranges_info). DCP's file writer asks the stream's position before and after
each item it writes, so the bytes between two such questions are exactly one item: the stream
here keeps the crc32 of each of those runs as the bytes go by. Reading the file back for them
instead would read the rank's whole share again at every commit: at 500 GB over 64 ranks, about
8 GB per rank per save.

Nothing depends on DCP asking in that order: a range the stream did not see as one run (a DCP that
writes differently, a seek, a short write) is read back and checksummed as before, and so is every
range of a file written elsewhere (a forked writer process). own_shards() puts a rank's runs
together, per data file, as the checksum info its list holds; imports no torch (DCP's classes
only as its index is read).
"""
from __future__ import annotations

import contextlib
import functools
import io
import os
import threading
import zlib
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple

from hpc.checkpoint import dcp_pickle
from hpc.checkpoint.checksums import ranges_info
from hpc.checkpoint.dcp_index import METADATA, rank_metadata
from hpc.checkpoint.layout import rank_of

Runs = Dict[Tuple[int, int], str]

SUFFIX = ".distcp"  # DCP's data files; its .metadata is checksummed whole (checksums.file_info)
MAX_FILES = 1024  # runs kept for files no commit asked for (a save that failed): dropped past this

_written: Dict[str, Runs] = {}
_lock = threading.Lock()


def _key(path: Any) -> str:
    return os.path.abspath(os.fspath(path))


def written(path: Any) -> Optional[Runs]:
    """The runs recorded while `path` was written in this process (once: they are forgotten)."""
    with _lock:
        return _written.pop(_key(path), None)


def _remember(path: Any, runs: Runs) -> None:
    with _lock:
        if len(_written) >= MAX_FILES:
            _written.clear()
        _written[_key(path)] = runs


class CrcStream:
    """A binary file being written, with the crc32 of each run of bytes between two tell() calls."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.runs: Runs = {}
        self.valid = True  # False once the runs can no longer be trusted to match the file
        self._mark = self._pos = self._crc = 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        n = self.raw.write(view)
        if n is None or n != view.nbytes:
            self.valid = False  # a short write: the caller writes the rest, the runs would not match
            return n
        self._crc = zlib.crc32(view, self._crc)
        self._pos += n
        return n

    def tell(self) -> int:
        at = self.raw.tell()
        if at != self._pos:
            self.valid = False
        elif self._pos > self._mark:
            self.runs[(self._mark, self._pos - self._mark)] = f"{self._crc:08x}"
        self._mark, self._crc = self._pos, 0
        return at

    def seek(self, *args: Any) -> int:
        self.valid = False
        return self.raw.seek(*args)

    def __getattr__(self, name: str) -> Any:  # fileno, flush, close, ...: the file's own
        return getattr(self.raw, name)


@functools.lru_cache(maxsize=None)
def _file_system() -> type:
    from torch.distributed.checkpoint.filesystem import FileSystem

    class CrcFileSystem(FileSystem):
        @contextlib.contextmanager
        def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
            if mode != "wb" or not os.fspath(path).endswith(SUFFIX):
                with super().create_stream(path, mode) as stream:
                    yield stream
                return
            with super().create_stream(path, mode) as raw:
                stream = CrcStream(raw)
                yield stream
            if stream.valid:
                _remember(path, stream.runs)

    return CrcFileSystem


def writer(directory: Any, rank: Optional[int] = None) -> Any:
    """DCP's file system writer for `directory`, with checksums taken as it writes.

    With `rank`, for a save that runs without DCP's collectives (``no_dist=True``, where DCP takes
    every process for rank 0): the data file is ``__{rank}_0.distcp`` and DCP's index of this
    rank's part is ``__{rank}.metadata``, committed beside it (hpc.checkpoint.dcp_index)."""
    from torch.distributed.checkpoint import FileSystemWriter

    w = FileSystemWriter(str(directory)) if rank is None else _rank_writer()(str(directory), own_rank=rank)
    w.fs = _file_system()()
    return w


@functools.lru_cache(maxsize=None)
def _rank_writer() -> type:
    from torch.distributed.checkpoint import FileSystemWriter

    class RankWriter(FileSystemWriter):
        def __init__(self, path: str, own_rank: int) -> None:
            super().__init__(path)
            self.own_rank = own_rank

        def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
            # DCP's per-rank layout (use_collectives=False), under this process's real rank.
            super().set_up_storage_writer(is_coordinator, rank=self.own_rank, use_collectives=False)

    return RankWriter


def own_shards(directory: Path, rank: int) -> dict[str, dict]:
    """Checksum info of this rank's DCP data files (``__R_K.distcp``, R its rank in the save's
    group), one crc32 per tensor stored (from DCP's index: this rank's own after a save without
    collectives, else .metadata), read right after they were written, while the page cache
    still holds them; after a save without collectives, that index part's checksum too (the
    rank's list names it: a load reads it)."""
    own = Path(directory) / rank_metadata(rank)
    path = own if own.exists() else Path(directory) / METADATA
    data = path.read_bytes()
    index = dcp_pickle.load(io.BytesIO(data), path)  # DCP's Metadata, pickled: plain data or refused
    ranges: dict[str, list[tuple[int, int]]] = {}
    for where in index.storage_data.values():
        if where.relative_path.endswith(SUFFIX) and rank_of(where.relative_path) == rank:
            ranges.setdefault(where.relative_path, []).append((where.offset, where.length))
    files = {name: ranges_info(Path(directory) / name, r, written(Path(directory) / name))
             for name, r in sorted(ranges.items())}
    if path == own:  # the rank's index part: committed beside its shards, checked whole when read
        files[own.name] = {"crc32": f"{zlib.crc32(data):08x}", "bytes": len(data)}
    return files
