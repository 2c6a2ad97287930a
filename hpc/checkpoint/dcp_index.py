"""DCP's index of a checkpoint saved without collectives: the ranks' parts, merged only where a load needs them.

    dcp_engine.DcpEngine(s).save(tmp, model, opt, collectives=False)   # every rank: __R.metadata
    index = merge([part_0, part_5])            # at a load: the parts this rank's layout reads
    uncovered(index, flat_state)               # what of this rank's load the index lacks
    merge_metadata(tmp, world_size)            # DCP's .metadata from all parts, for DCP's own reader

DCP's coordinator builds `.metadata` from every rank's plan and write results, gathered to rank
0 at each save: ranks x tensors chunks, which rank 0 unpickles, merges and pickles again (11 s
of CPU at 512 ranks and 300 tensors, BENCHMARKS.md). A save without collectives leaves each
rank's part of that index in its own file, listed with the rank's files (hpc.checkpoint.rank_lists),
and the commit merges nothing: what the coordinator's plan validation checks is checked from
counts each rank reports (hpc.checkpoint.dcp_claim). A load reads the parts that hold what its
layout needs (dcp_reader): under FSDP on the layout that saved, its own (shards and replicated values).
"""

from __future__ import annotations

import dataclasses
import math
import os
import pickle
import re
from pathlib import Path
from typing import Any, Iterable

from hpc.checkpoint import dcp_pickle
from hpc.checkpoint.layout import DCP_METADATA as METADATA  # DCP's coordinator writes it, or merge_metadata
from hpc.fs.atomic import write_bytes

__all__ = ["METADATA", "rank_metadata", "parts_in", "merge", "holes", "hole_error", "read_parts", "uncovered",
           "merge_metadata"]

_PART = re.compile(r"^__(\d+)\.metadata$")


def rank_metadata(rank: int) -> str:
    """DCP's index of one rank's part, written by a save without collectives."""
    return f"__{rank}{METADATA}"


def parts_in(names: Iterable[str]) -> list[int]:
    """The ranks whose index parts are among `names` (a marker's files, a listing), sorted."""
    return sorted(int(m.group(1)) for m in map(_PART.match, names) if m)


def merge(parts: Iterable[Any]) -> Any:
    """One DCP Metadata from parts (DCP's Metadata each): what DCP's coordinator writes, if the
    parts are every rank's. A chunk two ranks wrote (a DTensor replicated over a mesh dimension)
    is listed once, the first's."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    first: Any = None
    values: dict[str, Any] = {}
    pieces: dict[str, set] = {}  # fqn -> (offsets, sizes) of the chunks merged so far
    storage: dict[Any, Any] = {}
    mappings: dict[str, Any] = {}
    for part in parts:
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
            for chunk in meta.chunks:
                if (chunk.offsets, chunk.sizes) not in seen:
                    seen.add((chunk.offsets, chunk.sizes))
                    have.chunks.append(chunk)
        for index, info in part.storage_data.items():
            storage.setdefault(index, info)
        mappings.update(part.planner_data or {})
    return dataclasses.replace(first, state_dict_metadata=values, storage_data=storage,
                               planner_data=mappings or first.planner_data)


def holes(index: Any) -> tuple[list[str], list[str]]:
    """(unwritten, partial): values the saved state held that no part wrote, and tensors its
    chunks do not cover whole."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    unwritten = [fqn for fqn in (index.planner_data or {}) if fqn not in index.state_dict_metadata]
    partial = [fqn for fqn, meta in index.state_dict_metadata.items() if isinstance(meta, TensorStorageMetadata)
               and sum(math.prod(c.sizes) for c in meta.chunks) != math.prod(meta.size)]
    return unwritten, partial


def hole_error(directory: Any, unwritten: list[str], partial: list[str]) -> str:
    return (f"the ranks' parts of the checkpoint in {directory} leave {len(unwritten)} values unwritten and "
            f"{len(partial)} tensors incomplete ({', '.join((unwritten + partial)[:5])}). HINT: every rank "
            "must save the same model and optimizer, built the same way.")


def uncovered(index: Any, state: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(missing, short): the entries of a flattened load state that `index` does not hold at all,
    and the tensors whose chunks in it do not cover this rank's piece (its DTensor shard, or the
    whole tensor). DCP itself loads a piece no chunk covers without a word: it stays as it was."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.planner_helpers import _create_chunk_list

    missing, short = [], []
    for fqn, obj in state.items():
        meta = index.state_dict_metadata.get(fqn)
        if meta is None:
            missing.append(fqn)
        elif isinstance(meta, TensorStorageMetadata):
            try:
                wanted = _create_chunk_list(obj)
            except ValueError:  # not a tensor: DCP reports the mismatch of kinds itself
                continue
            if any(_overlap(want, meta.chunks) != math.prod(want.sizes) for want in wanted):
                short.append(fqn)
    return missing, short


def _overlap(want: Any, chunks: list) -> int:
    """Elements of the box `want` that `chunks` (distinct, as merged) cover."""
    total = 0
    for chunk in chunks:
        size = 1
        for wo, ws, co, cs in zip(want.offsets, want.sizes, chunk.offsets, chunk.sizes):
            size *= max(0, min(wo + ws, co + cs) - max(wo, co))
        total += size
    return total


def read_parts(directory: str | os.PathLike, ranks: Iterable[int]) -> Iterable[Any]:
    """The parts of `ranks`, one at a time (at 512 ranks they add up), each through the restricted
    unpickler. ValueError naming the rank when one is missing."""
    for rank in ranks:
        path = Path(directory) / rank_metadata(rank)
        try:
            with open(path, "rb") as fh:
                yield dcp_pickle.load(fh, path)  # a rank's file: plain data or refused
        except FileNotFoundError:
            raise ValueError(f"{path} is missing: rank {rank} did not finish its part of the "
                             "checkpoint. HINT: every rank must save the same step.") from None


def merge_metadata(directory: str | os.PathLike, world_size: int) -> None:
    """Write DCP's `.metadata` from every rank's part, for tools that read a checkpoint with DCP's
    own reader (hpc's loads read the parts). Raises ValueError when a part is missing, or when
    the parts leave a value unwritten or a tensor not covered whole: never an index with a hole."""
    index = merge(read_parts(directory, range(world_size)))
    unwritten, partial = holes(index)
    if unwritten or partial:
        raise ValueError(hole_error(directory, unwritten, partial))
    write_bytes(Path(directory) / METADATA, pickle.dumps(index))
