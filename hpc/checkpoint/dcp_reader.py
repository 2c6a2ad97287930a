"""DCP's reader for a checkpoint of the store: DCP's index read once, every byte checked as read,
nothing pickled run.

    r = reader(step_dir, marker_files(step_dir), rank)   # a torch.distributed.checkpoint StorageReader
    holds_optimizer_state(r)                             # from DCP's index, which r then keeps
    r.select(state)                                      # the index parts this rank's load needs
    dcp.load(state, checkpoint_id=str(step_dir), storage_reader=r, planner=planner(step_dir))
    # ShardCorrupt on a mismatch; UnsafeCheckpoint for a pickle that is not plain data

DCP unpickles its index with pickle.load and its non-tensor values (an optimizer's param_groups)
with torch.load(weights_only=False): either runs code a crafted checkpoint names. The reader here
loads the index through hpc.checkpoint.dcp_pickle, the planner the values with weights_only=True.

A checkpoint saved without DCP's collectives has no merged index: each rank's part (__R.metadata)
is listed with that rank's files (hpc.checkpoint.dcp_index, rank_lists). select() reads this
rank's own part and uses it when it covers every piece of the load state: under FSDP, on the
layout that saved, whatever the world size, each rank wrote its shards and its own copy of the
replicated values (hpc.checkpoint.replicas), so it reads 1 part and its own shard file. A checkpoint whose
replicated values only rank 0 wrote is covered by rank 0's part beside it. Otherwise (DDP,
whose ranks each read the whole state; a resharded FSDP load) it merges every part, as DCP's
coordinator would have at the save: O(ranks x tensors) CPU and ranks opens on each loading rank,
the cost a merged .metadata had at every load. Older checkpoints, and saves through DCP's
collectives, hold a merged .metadata, read as before.
"""

from __future__ import annotations

import functools
import os
import pickle
from pathlib import Path
from typing import Any

from hpc.checkpoint import dcp_index, dcp_pickle, optim_state, rank_lists
from hpc.checkpoint.checksums import matches, verify
from hpc.checkpoint.dcp_index import METADATA, rank_metadata
from hpc.checkpoint.layout import rank_of

__all__ = ["ShardCorrupt", "reader", "planner", "holds_optimizer_state"]


class ShardCorrupt(ValueError):
    """A DCP data file does not match the checksums its completion marker lists."""


def holds_optimizer_state(reader: Any) -> bool:
    """Whether a checkpoint holds per-parameter optimizer state, from DCP's index (read once: the
    reader keeps it; of a checkpoint in parts, the names every part lists). Without an index the
    answer is yes: the optimizer is filled in as before, never left short of state the checkpoint holds."""
    try:
        keys = reader.saved_names()
    except FileNotFoundError:
        return True
    return any(key.startswith(optim_state.OPTIMIZER_STATE_PREFIX) for key in keys)


def reader(directory: str | os.PathLike, files: dict | None, rank: int = 0) -> Any:
    """A FileSystemReader that reads DCP's index once however often it is asked for it, and, with
    `files` (the marker's checksums, with its ranks' lists read in so far), checks each stored
    tensor's bytes against the crc32 listed for it as it reads them: a rank reads its share once,
    verification included, never a whole file or another rank's shards (a rank's list holds one
    crc32 per (offset, length) range, see shardcrc.own_shards; another rank's list is read, once,
    when the load first needs one of that rank's files).
    `rank`: the loading rank, whose own index part select() reads first."""
    import io
    import zlib

    from torch.distributed.checkpoint import FileSystemReader

    known: dict[str, dict] = {}  # shard file -> {(offset, length): crc32}, from its entry's items
    whole: dict[str, str] = {}  # files whose marker entry has no per-tensor items: checked whole, once
    indexes: dict[str, Any] = {}  # file name -> DCP's Metadata in it
    refused: list[dcp_pickle.UnsafeCheckpoint] = []  # DCP turns these into a missing index
    if files is not None:
        # A marker naming the ranks' lists (rank_lists): a rank's files are known once its list is
        # read, and each rank with a list wrote an index part (a save without DCP's collectives).
        files = rank_lists.Files(directory, files, rank_of)
        parts = [] if METADATA in files else sorted(set(dcp_index.parts_in(files)) | set(files.ranks()))
    else:
        parts = [] if (Path(directory) / METADATA).exists() else dcp_index.parts_in(os.listdir(directory))

    def entry(name: str) -> Any:
        """The checksum info of `name`: the marker's, or its rank's list's, that list read on the
        first need of one of the rank's files (a rank on the layout that saved reads only its own)."""
        if name not in files and rank_of(name) is not None:
            problem = files.add(rank_of(name))
            if problem:
                raise ShardCorrupt(problem)
        return files.get(name)

    class CheckedReader(FileSystemReader):
        chosen: Any = None  # the index this load uses: the merged one, or select()'s parts

        def _index(self, name: str) -> Any:
            if name not in indexes:  # as DCP's own, through the restricted unpickler
                path = Path(directory) / name
                with self.fs.create_stream(path, "rb") as fh:
                    data = fh.read()
                if files is not None:
                    _check_index(path, data, entry(name))
                try:
                    indexes[name] = dcp_pickle.load(io.BytesIO(data), path)
                except dcp_pickle.UnsafeCheckpoint as err:
                    refused.append(err)
                    raise
            return indexes[name]

        def saved_names(self) -> Any:
            if not parts:
                return self._index(METADATA).state_dict_metadata
            first = rank_metadata(rank if rank in parts else parts[0])
            return self._index(first).planner_data or self._index(first).state_dict_metadata

        def select(self, state: dict) -> None:
            """The index for loading `state` (DCP's state dict of this rank's layout)."""
            if not parts:
                return
            from torch.distributed.checkpoint._nested_dict import flatten_state_dict

            flat = flatten_state_dict(state)[0]
            # Widest last: the rank's own part (FSDP on the layout that saved: its shards and its
            # copy of the replicated values), with rank 0's (a checkpoint whose replicated values
            # only rank 0 wrote), then every part (DDP, a resharded load).
            tried: list[int] = []
            for ranks in ([rank], sorted({rank, 0}), parts):
                ranks = [r for r in ranks if r in parts]
                if not ranks or ranks == tried:
                    continue
                tried = ranks
                index = dcp_index.merge(self._index(rank_metadata(r)) for r in ranks)
                gaps = dcp_index.uncovered(index, flat)
                if not any(gaps):
                    break
            short = gaps[1]
            if short:  # a missing name is DCP's to report, as for any index
                raise ShardCorrupt(f"the index parts in {directory} do not cover {len(short)} tensors of this "
                                   f"rank's load ({', '.join(short[:5])}). HINT: load another checkpoint; "
                                   "every rank of the job that saved must save the same model and optimizer")
            self.chosen = index

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            from torch.distributed.checkpoint.metadata import StorageMeta

            if kwargs.get("rank") is not None:  # DCP's fallback to a rank's own part
                index = self._index(rank_metadata(kwargs["rank"]))
            else:
                if self.chosen is None:
                    self.chosen = self._index(METADATA) if not parts else \
                        dcp_index.merge(self._index(rank_metadata(r)) for r in parts)
                index = self.chosen
            if getattr(index, "storage_meta", None) is None:
                index.storage_meta = StorageMeta()
            index.storage_meta.load_id = self.load_id  # this load's, as DCP sets it
            return index

        def raise_refusal(self) -> None:
            if refused:
                raise refused[0]

        def _slice_file(self, file: Any, sinfo: Any) -> Any:
            if files is None:
                return super()._slice_file(file, sinfo)
            name = sinfo.relative_path
            info = entry(name)
            if info is None:
                raise ShardCorrupt(f"{name} is not in the completion marker")
            if not isinstance(info, dict) or "items" not in info:
                if name not in whole:
                    whole[name] = verify(Path(directory) / name, info)
                if whole[name]:
                    raise ShardCorrupt(whole[name])
                return super()._slice_file(file, sinfo)
            if name not in known:
                known[name] = {(off, length): crc for off, length, crc in info["items"] or ()}
            file.seek(sinfo.offset)
            data = file.read(sinfo.length)
            crc = known[name].get((sinfo.offset, sinfo.length))
            if len(data) != sinfo.length or crc != f"{zlib.crc32(data):08x}":
                raise ShardCorrupt(f"{sinfo.relative_path} does not match its crc32 checksum at offset "
                                   f"{sinfo.offset} ({'truncated' if len(data) != sinfo.length else 'corrupted'})")
            return io.BytesIO(data)

    return CheckedReader(str(directory))


def _check_index(path: Path, data: bytes, info: Any) -> None:
    """DCP's index against the marker's checksum (`info`, None where it lists none), on the bytes
    read to load it: the store checks no more than its size, so a rank reads it once (ShardCorrupt
    when it does not match)."""
    if info is None:
        raise ShardCorrupt(f"{path.name} is not in the completion marker")
    # a legacy sha256 entry: checked by reading the file
    problem = verify(path, info) if isinstance(info, str) else matches(path.name, data, info)
    if problem:
        raise ShardCorrupt(problem)


def planner(directory: str | os.PathLike) -> Any:
    """DCP's default load planner, but a non-tensor value (DCP stores it as torch.save's bytes)
    is loaded with weights_only=True: plain data, never an object whose unpickling runs code."""
    return _planner_class()(Path(directory))


@functools.lru_cache(maxsize=None)
def _planner_class() -> type:
    import torch
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element

    class PlainDataPlanner(DefaultLoadPlanner):
        def __init__(self, directory: Path) -> None:
            super().__init__()
            self.directory = directory

        def load_bytes(self, read_item: Any, value: Any) -> None:
            fqn = read_item.dest_index.fqn
            try:
                obj = torch.load(value, weights_only=True)
            except pickle.UnpicklingError as err:
                where = self.metadata.storage_data[read_item.storage_index].relative_path
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise dcp_pickle.UnsafeCheckpoint(
                    dcp_pickle.refusal(self.directory / where, f"a value for {fqn} that weights_only "
                                       f"loading refuses ({first})")) from None
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[fqn], obj)
            else:
                self.state_dict[fqn] = obj

    return PlainDataPlanner
