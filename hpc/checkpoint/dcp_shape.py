"""Whether an unpickled object has the shape of DCP's index, as a load and hpc's merge read it.

    problem(index)        # None, or what is not as DCP writes it: "chunks of model.w: a str"
    CALLS["Size"]((4, 4)) # what hpc.checkpoint.dcp_pickle calls for a name DCP pickles: checked
    shared(obj)           # None, or why a second reference to obj is not DCP's: "one list"

hpc.checkpoint.dcp_pickle builds only DCP's records, but a crafted file can still put them
together wrongly (a record without its fields, a string for a list, a chunk of another rank
than its tensor): without this check such an index would fail later, deep in DCP's reader or in
hpc's merge, with whatever error that code happens to raise. The walk is one pass over what the
index holds, chunks included (0.1 s for the 150,000 chunks of 512 ranks x 300 tensors).

The pieces are checked as the unpickler builds them, before any of them is copied: a Size of
DIMS_MAX sizes at most, one path, a layout's name, a memory format's number; and a second
reference only to what has a bounded size (a number, a short string, a Size, a record of those),
never to a list, dict or tuple, which DCP's index never shares: a file of a few bytes per
reference would otherwise have each call copy one long list, or this walk and hpc's merge walk
one list of chunks for every tensor.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import types
from typing import Any

__all__ = ["problem", "CALLS", "PATH_MAX", "DIMS_MAX", "atoms", "field_names", "shared"]

PATH_MAX = 4096  # a path's length, at most, on Linux; and a string's that is referenced twice
DIMS_MAX = 64  # a tensor's dimensions, at most

_NONE = type(None)
_MISSING = object()


def _fields(obj: Any, kinds: dict[str, Any]) -> str | None:
    for name, kind in kinds.items():
        value = getattr(obj, name, _MISSING)
        if value is _MISSING or not isinstance(value, kind):
            return f"{type(obj).__name__}.{name}: {'missing' if value is _MISSING else type(value).__name__}"
    return None


def _tensor(fqn: str, meta: Any) -> str | None:
    import torch
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorProperties

    wrong = _fields(meta, {"properties": TensorProperties, "size": torch.Size, "chunks": list}) or _fields(
        meta.properties, {"dtype": torch.dtype, "layout": torch.layout, "requires_grad": bool,
                          "memory_format": torch.memory_format, "pin_memory": bool})
    if wrong:
        return f"{fqn}: {wrong}"
    dims = len(meta.size)
    for chunk in meta.chunks:
        if type(chunk) is not ChunkStorageMetadata:
            return f"a chunk of {fqn}: {type(chunk).__name__}"
        offsets, sizes = getattr(chunk, "offsets", None), getattr(chunk, "sizes", None)
        if type(offsets) is not torch.Size or type(sizes) is not torch.Size or len(offsets) != dims \
                or len(sizes) != dims:
            return f"a chunk of {fqn} that is not {dims}-dimensional"
    return None


def _storage(key: Any, info: Any) -> str | None:
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex

    if type(key) is not MetadataIndex or type(info) is not _StorageInfo:
        return f"storage_data: {type(key).__name__} -> {type(info).__name__}"
    wrong = _fields(key, {"fqn": str, "offset": (torch.Size, _NONE), "index": (int, _NONE)}) or _fields(
        info, {"relative_path": str, "offset": int, "length": int, "transform_descriptors": (list, tuple, _NONE)})
    if wrong:
        return wrong
    if "/" in info.relative_path or "\\" in info.relative_path or info.relative_path in ("", ".", ".."):
        return f"a shard file {info.relative_path[:80]!r} outside the checkpoint's directory"
    return None


def problem(index: Any) -> str | None:
    """None when `index` is DCP's Metadata as DCP writes it, else what is not, in a few words."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta, TensorStorageMetadata

    if type(index) is not Metadata:
        return f"a {type(index).__name__} where DCP's Metadata belongs"
    wrong = _fields(index, {"state_dict_metadata": dict, "planner_data": (dict, _NONE),
                            "storage_data": (dict, _NONE), "storage_meta": (StorageMeta, _NONE),
                            "version": (str, _NONE)})
    if wrong:
        return wrong
    if index.storage_meta is not None:
        import os

        wrong = _fields(index.storage_meta, {"checkpoint_id": (str, os.PathLike, _NONE), "save_id": (str, _NONE),
                                             "load_id": (str, _NONE), "modules": list})
        if wrong:
            return wrong
    for fqn, meta in index.state_dict_metadata.items():
        if not isinstance(fqn, str) or type(meta) not in (TensorStorageMetadata, BytesStorageMetadata):
            return f"state_dict_metadata: {type(fqn).__name__} -> {type(meta).__name__}"
        wrong = _tensor(fqn, meta) if type(meta) is TensorStorageMetadata else None
        if wrong:
            return wrong
    for key, info in (index.storage_data or {}).items():
        wrong = _storage(key, info)
        if wrong:
            return wrong
    for fqn, names in (index.planner_data or {}).items():  # fqn -> its path in the state: ("model", "w")
        if not isinstance(fqn, str) or not isinstance(names, tuple) \
                or not all(isinstance(n, (str, int)) for n in names):
            return f"planner_data: {type(fqn).__name__} -> {type(names).__name__}"
    return None


# What an index calls, each through a check of its arguments: the callables themselves copy
# (torch.Size copies a list, PosixPath joins strings, an enum's or a layout's error prints its
# argument), and one argument the file spells once can be referenced by every call.
def _path(*parts: Any) -> pathlib.PosixPath:
    """PosixPath(*parts), for parts that make one path: joined, a file's repeated references
    to one long string would build a string many times the file's size."""
    if not all(isinstance(part, str) for part in parts) or sum(map(len, parts)) > PATH_MAX:
        raise ValueError(f"a path of {len(parts)} parts that is not one path of {PATH_MAX} characters at most")
    return pathlib.PosixPath(*parts)


def _size(dims: Any = ()) -> Any:
    """torch.Size(dims), for the dimensions of a tensor."""
    import torch

    if type(dims) not in (tuple, list) or len(dims) > DIMS_MAX \
            or not all(type(dim) is int and 0 <= dim < 2**63 for dim in dims):
        raise ValueError(f"a torch.Size of a {type(dims).__name__}, not of {DIMS_MAX} ints from 0 to 2**63-1 at most")
    return torch.Size(dims)


def _layout(name: Any) -> Any:
    """torch.serialization._get_layout(name): torch.strided from "torch.strided"."""
    from torch.serialization import _get_layout

    if type(name) is not str or len(name) > 64:
        raise ValueError(f"a layout named by a {type(name).__name__} that is not a layout's name")
    return _get_layout(name)


def _mem_format(code: Any) -> Any:
    """DCP's _MEM_FORMAT_ENCODING(code): a tensor's memory format, by its number."""
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    if type(code) is not int:
        raise ValueError(f"a memory format numbered by a {type(code).__name__}")
    return _MEM_FORMAT_ENCODING(code)


# name -> what a REDUCE of it calls; every other name is a record's class (NEWOBJ, then BUILD).
CALLS = {"PosixPath": _path, "Size": _size, "_get_layout": _layout, "_MEM_FORMAT_ENCODING": _mem_format}


@functools.cache
def atoms() -> frozenset:
    """The types of what has a bounded size: numbers, classes, the checked calls and what they return."""
    import torch
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    return frozenset({int, float, bool, type(None), type, types.FunctionType, pathlib.PosixPath, torch.Size,
                      torch.dtype, torch.layout, torch.memory_format, _MEM_FORMAT_ENCODING})


@functools.cache
def field_names(cls: type) -> frozenset:
    return frozenset(field.name for field in dataclasses.fields(cls))


def _atom(obj: Any) -> str | None:
    """None for an atom (a short string, or of atoms()), else what `obj` is."""
    if type(obj) is str:
        return f"a string of {len(obj)} characters" if len(obj) > PATH_MAX else None
    return None if type(obj) in atoms() else f"one {type(obj).__name__}"


def shared(obj: Any) -> str | None:
    """None when a second reference to `obj` is bounded: an atom, or a record whose fields, set,
    are atoms (a TensorProperties); else what `obj` is. DCP's index shares no list, dict or tuple,
    and readers that walk each reference (hpc's merge) would walk a shared one many times."""
    if type(obj) is str or type(obj) in atoms() or not dataclasses.is_dataclass(obj):
        return _atom(obj)
    if field_names(type(obj)) and not vars(obj):
        return f"one {type(obj).__name__} before its fields are set"
    wrong = next(filter(None, map(_atom, vars(obj).values())), None)
    return f"one {type(obj).__name__} that holds {wrong}" if wrong else None
