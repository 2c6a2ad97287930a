"""DCP's pickled index read without running pickled code: only the types and opcodes DCP's index is made of.

    index = load(open("step-8/.metadata", "rb"), "step-8/.metadata")   # DCP's Metadata
    # anything else in it: UnsafeCheckpoint, before any of it is called

torch.distributed.checkpoint pickles its index of a checkpoint (``.metadata``; after a save without
collectives each rank's ``__R.metadata`` too) and its own reader loads it with pickle.load: a
crafted index runs whatever its reduce names (os.system, ...) in whoever loads the checkpoint, an
evaluation job reading another user's run included, and the marker's checksums do not stop it (the
author of the file writes the marker too). Here a reader admits only what torch 2.13's DCP writes
into an index (its metadata classes, its storage records, torch's Size, dtypes and layouts, a
path), only the opcodes that pickle's protocols 4 and 5 use for those, and at most MAX_BYTES; the
result must have the shape of DCP's Metadata (dcp_shape). Every other outcome of a file, a crafted
one's included, is one UnsafeCheckpoint. Python's own unpickler, not the C one: the C reader sizes
its memo and a bytes object from numbers in the file before reading on (a 9-byte file asks for
gigabytes), where Python's keeps its memo in a dict and its reads stop at the data's end.
It costs about 5x the C reader's: 12 ms for a rank's 66 kB part (bench.rank_costs).
"""

from __future__ import annotations

import dataclasses
import io
import pathlib
import pickle
from typing import IO, Any

from hpc.checkpoint.dcp_shape import problem

__all__ = ["UnsafeCheckpoint", "ADMITTED", "OPCODES", "MAX_BYTES", "load", "refusal"]

MAX_BYTES = 2**30  # DCP's coordinator's .metadata at 512 ranks and 300 sharded tensors: 25 MB (BENCHMARKS.md)
_PATH_MAX = 4096  # a path's length, at most, on Linux


class UnsafeCheckpoint(ValueError):
    """A checkpoint's file holds a pickled object that loading it would have to run or build."""


# module -> the names an index written by torch 2.13's DCP holds (listed from a save's pickle).
ADMITTED: dict[str, set[str]] = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "StorageMeta", "MetadataIndex", "TensorStorageMetadata", "BytesStorageMetadata",
        "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},  # a layout from its name (torch.strided)
    "torch": {"Size"},  # and every torch.dtype (_admitted)
    "pathlib": {"PosixPath"},  # StorageMeta.checkpoint_id, through _path
}

# What pickle's protocols 4 and 5 write for those: numbers, strings, containers, the memo by
# MEMOIZE, globals by STACK_GLOBAL, objects by NEWOBJ / REDUCE / BUILD. Not among them: bytes and
# bytearrays, the memo's numbered PUTs, persistent ids, extensions, protocol 0's text forms.
OPCODES = frozenset(getattr(pickle, name)[0] for name in (
    "PROTO", "FRAME", "STOP", "MARK", "NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2",
    "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE",
    "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "APPEND", "APPENDS", "SETITEM", "SETITEMS", "MEMOIZE",
    "BINGET", "LONG_BINGET", "STACK_GLOBAL", "NEWOBJ", "REDUCE", "BUILD"))


def _admitted(module: str, name: str) -> bool:
    if "." in name:  # a dotted name walks attributes: Metadata.__init__.__globals__
        return False
    if module == "torch" and name != "Size":
        import torch

        return isinstance(vars(torch).get(name), torch.dtype)
    return name in ADMITTED.get(module, ())


def _path(*parts: Any) -> pathlib.PosixPath:
    """PosixPath(*parts), for parts that make one path: joined, a file's repeated references
    to one long string would build a string many times the file's size."""
    if not all(isinstance(part, str) for part in parts) or sum(map(len, parts)) > _PATH_MAX:
        raise ValueError(f"a path of {len(parts)} parts that is not one path of {_PATH_MAX} characters at most")
    return pathlib.PosixPath(*parts)


def refusal(path: Any, what: str) -> str:
    return (f"{path} holds {what}, which a checkpoint's DCP index never holds: refused, loading never "
            "runs pickled code. HINT: delete this checkpoint or read another one; if a newer torch "
            "wrote this type into its index, add it to hpc.checkpoint.dcp_pickle.ADMITTED")


class _Opcodes(dict):
    """pickle's dispatch table, OPCODES only: any other opcode is refused by name."""

    def __missing__(self, code: int) -> Any:
        def refuse(unpickler: _Unpickler) -> None:
            import pickletools

            op = next((op.name for op in pickletools.opcodes if op.code == chr(code)), f"byte {code:#04x}")
            raise UnsafeCheckpoint(refusal(unpickler.path, f"the pickle opcode {op}"))
        return refuse


class _Unpickler(pickle._Unpickler):  # type: ignore[name-defined]
    """pickle's reader in Python over bytes in memory: one index moves through them, frames are
    checked and stepped over."""

    def __init__(self, data: bytes, path: Any) -> None:
        super().__init__(io.BytesIO())
        self.data, self.at, self.path = data, 0, path

    def read(self, n: int) -> bytes:  # what every opcode's handler reads its argument with
        start, end = self.at, self.at + n
        if end > len(self.data):
            raise EOFError(f"{n} bytes wanted at byte {start} of {len(self.data)}")
        self.at = end
        return self.data[start:end]

    def load(self) -> Any:
        self.metastack, self.stack, self.proto = [], [], 0
        self.append = self.stack.append
        data, dispatch = self.data, self.dispatch
        try:
            while True:
                at = self.at
                self.at = at + 1
                dispatch[data[at]](self)  # IndexError at the data's end
        except pickle._Stop as stop:  # type: ignore[attr-defined]
            return stop.value

    def load_frame(self) -> None:
        size = int.from_bytes(self.read(8), "little")
        if size > len(self.data) - self.at:
            raise EOFError(f"a frame of {size} bytes at byte {self.at} of {len(self.data)}")

    def find_class(self, module: str, name: str) -> Any:
        if not _admitted(module, name):
            raise UnsafeCheckpoint(refusal(self.path, f"{module}.{name}"))
        return _path if module == "pathlib" else super().find_class(module, name)

    def load_build(self) -> None:
        """State is set on a DCP record this file built, never on a class, an enum's member or a
        dtype, which every later user of torch shares."""
        target = self.stack[-2]
        if isinstance(target, type) or not dataclasses.is_dataclass(target):
            raise UnsafeCheckpoint(refusal(self.path, f"state to set on a {type(target).__name__}"))
        pickle._Unpickler.load_build(self)  # type: ignore[attr-defined]

    dispatch = _Opcodes({code: pickle._Unpickler.dispatch[code] for code in OPCODES})  # type: ignore[attr-defined]
    dispatch[pickle.BUILD[0]] = load_build
    dispatch[pickle.FRAME[0]] = load_frame


def _read(file: IO[bytes], path: Any) -> bytes:
    """`file`'s bytes, MAX_BYTES at most, read in pieces: one read of MAX_BYTES would reserve them."""
    pieces, total = [], 0
    while piece := file.read(1 << 20):
        total += len(piece)
        if total > MAX_BYTES:
            raise UnsafeCheckpoint(f"{path} is over {MAX_BYTES} bytes, more than a DCP index of any checkpoint "
                                   "hpc writes: refused. HINT: delete this checkpoint or read another one")
        pieces.append(piece)
    return b"".join(pieces)


def load(file: IO[bytes], path: Any) -> Any:
    """Unpickle DCP's index from `file` (read from `path`, named in errors): DCP's Metadata, or
    UnsafeCheckpoint whatever else the file holds."""
    data = _read(file, path)
    try:
        index = _Unpickler(data, path).load()
        wrong = problem(index)
    except UnsafeCheckpoint:
        raise
    except Exception as err:  # MemoryError and RecursionError too: whatever a crafted file leads to
        wrong = f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"
    if wrong:
        raise UnsafeCheckpoint(f"{path} is not a DCP index ({wrong}). HINT: delete this checkpoint or read "
                               "another one")
    return index
