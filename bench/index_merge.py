"""One DCP .metadata merged from the ranks' index parts, beside the work DCP's coordinator does on
rank 0 for the same parts at a save with collectives, at world sizes no machine here launches.

    python -m bench.index_merge 64 512        # one line per world size

hpc's commit merges nothing: each rank commits its own DCP index part (__R.metadata), named in its
own list of files (files-R.json, hpc.checkpoint.rank_lists), and the marker names the lists; rank 0
checks the ranks' claims of what they wrote (hpc.checkpoint.dcp_claim) and reads no part. The merge
measured here (hpc.checkpoint.dcp_index.merge_metadata) is what a tool that reads the checkpoint with
DCP's own reader would run, and about what rank 0 does only when the claims disagree (to name what
is missing); a resharded load merges the parts it reads (bench.rank_costs).

W ranks each hold a dim-0 shard of each of TENSORS tensors (an FSDP model with its optimizer
states); the parts are built, not saved by W processes. The merge reads the W pickled per-rank
indexes, merges them and writes .metadata. DCP's coordinator: unpickle the W local plans that
gather_object delivers, build the global plan and metadata (DefaultSavePlanner), unpickle the W
lists of write results, and write .metadata (FileSystemWriter.finish), while every other rank waits
for it inside the collectives. The transport of DCP's collectives is not counted. Both write
.metadata with an fsync.
"""
from __future__ import annotations

import pickle
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

TENSORS, ROWS, COLS = 300, 4096, 1024


def _parts(world: int) -> tuple:
    """Per rank: (its own index as its save writes it, its local plan, its write results)."""
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata, MetadataIndex,
                                                       TensorProperties, TensorStorageMetadata)
    from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType
    from torch.distributed.checkpoint.storage import WriteResult

    props, size = TensorProperties(dtype=torch.float32), torch.Size([ROWS, COLS])
    mappings = {f"model.layers.{t}.weight": ("model", f"layers.{t}.weight") for t in range(TENSORS)}
    indexes, plans, results = [], [], []
    for rank in range(world):
        rows = ROWS // world
        values, storage, items, written = {}, {}, [], []
        for t, fqn in enumerate(mappings):
            chunk = ChunkStorageMetadata(offsets=torch.Size([rank * rows, 0]), sizes=torch.Size([rows, COLS]))
            where = _StorageInfo(f"__{rank}_0.distcp", t * rows * COLS * 4, rows * COLS * 4)
            index = MetadataIndex(fqn, chunk.offsets)
            values[fqn] = TensorStorageMetadata(properties=props, size=size, chunks=[chunk])
            storage[index] = where
            items.append(WriteItem(index=index, type=WriteItemType.SHARD,
                                   tensor_data=TensorWriteData(chunk=chunk, properties=props, size=size)))
            written.append(WriteResult(index=index, size_in_bytes=where.length, storage_data=where))
        indexes.append(pickle.dumps(Metadata(state_dict_metadata=values, planner_data=mappings, storage_data=storage)))
        plans.append(pickle.dumps(SavePlan(items, planner_data=mappings)))
        results.append(pickle.dumps(written))
    return indexes, plans, results


def _dcp_coordinator(plans: List[bytes], results: List[bytes], out: Path) -> None:
    from torch.distributed.checkpoint import DefaultSavePlanner, FileSystemWriter

    planner = DefaultSavePlanner()
    _, metadata = planner.create_global_plan([pickle.loads(b) for b in plans])
    writer = FileSystemWriter(str(out))
    writer.finish(metadata=metadata, results=[pickle.loads(b) for b in results])


def measure(world: int) -> Dict[str, float]:
    from hpc.checkpoint.dcp_index import merge_metadata, rank_metadata

    indexes, plans, results = _parts(world)
    root = Path(tempfile.mkdtemp(prefix="hpc-bench-merge-"))
    try:
        hpc_dir, dcp_dir = root / "hpc", root / "dcp"
        hpc_dir.mkdir()
        dcp_dir.mkdir()
        for rank, blob in enumerate(indexes):
            (hpc_dir / rank_metadata(rank)).write_bytes(blob)
        t0 = time.perf_counter()
        merge_metadata(hpc_dir, world)
        t1 = time.perf_counter()
        _dcp_coordinator(plans, results, dcp_dir)
        t2 = time.perf_counter()
        same = pickle.loads((hpc_dir / ".metadata").read_bytes()).state_dict_metadata == \
            pickle.loads((dcp_dir / ".metadata").read_bytes()).state_dict_metadata
        return {"world": world, "hpc_s": t1 - t0, "dcp_s": t2 - t1, "same": same,
                "part_bytes": len(indexes[0]), "metadata_bytes": (hpc_dir / ".metadata").stat().st_size}
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    for w in map(int, sys.argv[1:] or ["64"]):
        m = measure(w)
        print(f"world {w}: hpc's merge {m['hpc_s'] * 1e3:.0f} ms, DCP's coordinator {m['dcp_s'] * 1e3:.0f} ms, "
              f"same index {m['same']}, part {m['part_bytes'] / 1e3:.0f} kB, .metadata {m['metadata_bytes'] / 1e6:.1f} MB")
