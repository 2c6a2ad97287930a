"""DCP's index of a checkpoint (`.metadata`) for saves made without DCP's collectives.

    dcp_engine.DcpEngine(s).save(tmp, model, opt, collectives=False)   # every rank: __R.metadata
    merge_metadata(tmp, world_size)           # one process, once every rank has finished: .metadata

DCP's coordinator builds `.metadata` from every rank's plan and write results, gathered to rank
0 at each save. A save without collectives leaves each rank's part of that index in its own
file (rank_metadata); the merge here is the coordinator's step done from those files by the
commit, which already waits for every rank's report. It also checks what the coordinator's plan
validation checks: every value written by some rank, every tensor covered whole.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pickle
from pathlib import Path
from typing import Any

from hpc.checkpoint import dcp_pickle
from hpc.checkpoint.layout import DCP_METADATA as METADATA  # DCP's coordinator writes it, or the merge
from hpc.fs.atomic import write_bytes

__all__ = ["METADATA", "rank_metadata", "merge_metadata"]


def rank_metadata(rank: int) -> str:
    """DCP's index of one rank's part, written by a save without collectives."""
    return f"__{rank}{METADATA}"


def merge_metadata(directory: str | os.PathLike, world_size: int) -> None:
    """Write DCP's `.metadata` for a save without collectives, from the ranks' own indexes: what
    DCP's coordinator would have written. Call once every rank's save has finished. Raises
    ValueError when a rank's index is missing, or when the parts leave a value unwritten or a
    tensor not covered whole (ranks that disagreed about who writes what): never a checkpoint
    that loads with a hole in it."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    first: Any = None
    values: dict[str, Any] = {}
    pieces: dict[str, set] = {}  # fqn -> (offsets, sizes) of the chunks merged so far
    storage: dict[Any, Any] = {}
    mappings: dict[str, Any] = {}
    for rank in range(world_size):  # one part in memory at a time: at 512 ranks they add up
        path = Path(directory) / rank_metadata(rank)
        try:
            with open(path, "rb") as fh:
                part = dcp_pickle.load(fh, path)  # a rank's file: plain data or refused
        except FileNotFoundError:
            raise ValueError(f"{path} is missing: rank {rank} did not finish its part of the "
                             "checkpoint. HINT: every rank must save the same step.") from None
        first = first or part
        for fqn, meta in part.state_dict_metadata.items():
            if not isinstance(meta, TensorStorageMetadata):
                values.setdefault(fqn, meta)
                continue
            have = values.get(fqn)
            if have is None:
                have = values[fqn] = dataclasses.replace(meta, chunks=[])
                pieces[fqn] = set()
            seen = pieces[fqn]
            for chunk in meta.chunks:  # a piece two ranks wrote (replicated shards): the first's
                if (chunk.offsets, chunk.sizes) not in seen:
                    seen.add((chunk.offsets, chunk.sizes))
                    have.chunks.append(chunk)
        for index, info in part.storage_data.items():
            storage.setdefault(index, info)
        mappings.update(part.planner_data or {})
    unwritten = [fqn for fqn in mappings if fqn not in values]
    partial = [fqn for fqn, meta in values.items() if isinstance(meta, TensorStorageMetadata)
               and sum(math.prod(c.sizes) for c in meta.chunks) != math.prod(meta.size)]
    if unwritten or partial:
        what = ", ".join((unwritten + partial)[:5])
        raise ValueError(f"the ranks' parts of the checkpoint in {directory} leave {len(unwritten)} values "
                         f"unwritten and {len(partial)} tensors incomplete ({what}). HINT: every rank "
                         "must save the same model and optimizer, built the same way.")
    merged = dataclasses.replace(first, state_dict_metadata=values, storage_data=storage,
                                 planner_data=mappings or first.planner_data)
    write_bytes(Path(directory) / METADATA, pickle.dumps(merged))
