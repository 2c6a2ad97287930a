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
result must have the shape of DCP's Metadata (dcp_shape). Nothing a few bytes of a file name
builds much: a call is one of dcp_shape.CALLS, which check their arguments, and builds in all
no more elements than the file has bytes; a record is made as DCP pickles one (no arguments,
then its own fields, once); a second reference is only to what dcp_shape.shared admits. Every
other outcome of a file, a crafted one's included, is one UnsafeCheckpoint. Python's own
unpickler, not the C one: the C reader sizes its memo and a bytes object from numbers in the
file before reading on (a 9-byte file asks for gigabytes), where Python's keeps its memo in a
dict and its reads stop at the data's end.
It costs about 14x the C reader's: 11 ms for a rank's 66 kB part (bench.index_merge's parts).
"""

from __future__ import annotations

import dataclasses
import io
import pathlib
import pickle
import struct
from typing import IO, Any

from hpc.checkpoint.dcp_shape import CALLS, PATH_MAX, atoms, field_names, problem, shared

__all__ = ["UnsafeCheckpoint", "ADMITTED", "OPCODES", "MAX_BYTES", "load", "refusal"]

MAX_BYTES = 2**30  # DCP's coordinator's .metadata at 512 ranks and 300 sharded tensors: 25 MB (BENCHMARKS.md)


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
    "pathlib": {"PosixPath"},  # StorageMeta.checkpoint_id; these four through dcp_shape.CALLS
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


def _built(obj: Any) -> int:
    """The elements a checked call built: a Size's dimensions, a path's characters."""
    return 1 + (len(obj) if isinstance(obj, tuple) else len(str(obj)) if isinstance(obj, pathlib.PurePath) else 0)


def _named(obj: Any) -> str:
    return obj.__name__ if isinstance(obj, type) else f"a {type(obj).__name__}"


def not_an_index(path: Any, wrong: str) -> str:
    return f"{path} is not a DCP index ({wrong}). HINT: delete this checkpoint or read another one"


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
        self.budget = len(data) + PATH_MAX  # elements the checked calls may build: a file spells out its Sizes
        self.atoms = atoms()

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
        return CALLS.get(name) or super().find_class(module, name)

    def refuse(self, wrong: str) -> None:
        raise UnsafeCheckpoint(not_an_index(self.path, wrong))

    def load_reduce(self) -> None:
        """A call of the checked callables only, as DCP pickles a Size, a path, a layout, an enum."""
        call, args = self.stack[-2], self.stack[-1]
        if not any(call is known for known in CALLS.values()) or type(args) is not tuple:
            self.refuse(f"a call of {_named(call)}, not of {', '.join(CALLS)}")
        del self.stack[-2:]
        self.append(obj := call(*args))
        self.budget -= _built(obj)
        if self.budget < 0:
            self.refuse(f"calls that build more elements than the file's {len(self.data)} bytes")

    def load_newobj(self) -> None:
        """A DCP record, as pickle writes a dataclass: its class's __new__ with no arguments."""
        cls, args = self.stack[-2], self.stack[-1]
        if not isinstance(cls, type) or not dataclasses.is_dataclass(cls) or type(args) is not tuple or args:
            self.refuse(f"a new {_named(cls)} from {_named(args)}, not a DCP record from no arguments")
        del self.stack[-2:]
        self.append(cls.__new__(cls))

    def load_build(self) -> None:
        """State is set on a DCP record this file built, never on a class, an enum's member or a
        dtype, which every later user of torch shares; and only the record's fields, once, as DCP
        pickles them (a tuple of them for TensorProperties, which sets them itself)."""
        target, state = self.stack[-2], self.stack[-1]
        if isinstance(target, type) or not dataclasses.is_dataclass(target):
            raise UnsafeCheckpoint(refusal(self.path, f"state to set on a {type(target).__name__}"))
        if vars(target):  # once, before a second reference to it: dcp_shape.shared
            self.refuse(f"the fields of one {type(target).__name__} set twice")
        fields = field_names(type(target))
        if not (type(state) is tuple and len(state) == len(fields) if hasattr(target, "__setstate__")
                else type(state) is dict and fields.issuperset(state)):
            self.refuse(f"{_named(state)} as the state of a {type(target).__name__}, not its fields")
        pickle._Unpickler.load_build(self)  # type: ignore[attr-defined]

    def get(self, at: int) -> None:
        """BINGET and LONG_BINGET: a second reference, to what DCP's index shares only."""
        obj = self.memo.get(at, self.memo)  # the memo itself: no entry
        if type(obj) in self.atoms or type(obj) is str and len(obj) <= PATH_MAX:
            return self.append(obj)  # the most of an index's references: a class, a dtype, a name
        wrong = f"the memo's entry {at}, which the file did not make" if obj is self.memo else shared(obj)
        if wrong:
            self.refuse(f"a second reference to {wrong}")
        self.append(obj)

    dispatch = _Opcodes({code: pickle._Unpickler.dispatch[code] for code in OPCODES})  # type: ignore[attr-defined]
    dispatch.update({pickle.BUILD[0]: load_build, pickle.FRAME[0]: load_frame, pickle.REDUCE[0]: load_reduce,
                     pickle.NEWOBJ[0]: load_newobj, pickle.BINGET[0]: lambda self: self.get(self.read(1)[0]),
                     pickle.LONG_BINGET[0]: lambda self: self.get(struct.unpack("<I", self.read(4))[0])})


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
        raise UnsafeCheckpoint(not_an_index(path, wrong))
    return index
