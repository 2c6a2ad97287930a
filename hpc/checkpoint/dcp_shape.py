"""Whether an unpickled object has the shape of DCP's index, as a load and hpc's merge read it.

    problem(index)        # None, or what is not as DCP writes it: "chunks of model.w: a str"

hpc.checkpoint.dcp_pickle builds only DCP's records, but a crafted file can still put them
together wrongly (a record without its fields, a string for a list, a chunk of another rank
than its tensor): without this check such an index would fail later, deep in DCP's reader or in
hpc's merge, with whatever error that code happens to raise. The walk is one pass over what the
index holds, chunks included (0.1 s for the 150,000 chunks of 512 ranks x 300 tensors).
"""

from __future__ import annotations

from typing import Any

__all__ = ["problem"]

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
