"""Atomic, discoverable checkpoints: ``step-N/`` directories written in the background.

Usage::

    store = CheckpointStore("run/stage/checkpoints", keep=3, rank=s.rank, world_size=s.world_size)
    state = store.load()                     # newest valid checkpoint, or None on a first run
    store.save(step, {"model": m.state_dict(), "per_rank": {"rng": rng.capture()}})
    store.save(last, state, blocking=True)   # the final save waits for the disk
    store.close()

Layout of one checkpoint (every rank calls ``save``; rank 0 commits)::

    step-120/shared.pt        state minus "per_rank", written by rank 0
    step-120/rank-R.pt        state["per_rank"] of rank R (RNG, sampler position, ...)
    step-120/COMPLETE.json    marker: step, shared files and each rank's list, with crc32 and size; written last
    step-120/files-R.json     rank R's list of its files, with their crc32s (per tensor for shards)
    step-120/__R_0.distcp     with save(..., sharded=): model and optimizer shards (dcp_engine)
    step-120/__R.metadata     DCP's index of rank R's shards (TrainLoop saves without DCP's
                              collectives; a load reads the parts it needs, dcp_index), or
    step-120/.metadata        DCP's index of all shards (a save with DCP's collectives, or older)

While it is written, .step-120.tmp/ also holds each rank's report to rank 0 (rank-R.done): the
commit deletes them before it writes the marker, so a committed checkpoint holds 4 files per
rank (its shards, its index part, rank-R.pt and files-R.json) and 2 shared ones.

Files are written into ``.step-N.tmp/`` (temporary name, fsync, rename), then rank 0 writes the
marker and renames the directory, from the checksum each rank reported for its list of its files
(rank 0 reads no other rank's data, nor its list: the marker grows with the ranks, not with ranks x
tensors; rank_lists). A directory counts only with a marker whose sizes match (a rank of a job
looks at the shared files, its list and its own files), and a load verifies the checksums of what it
reads, so a process killed mid-write leaves the previous checkpoint as the newest valid one.
Loading never runs pickled code: the store's files go through ``torch.load(weights_only=True)``,
DCP's index through an unpickler that admits only the types DCP writes, and DCP's non-tensor
values through ``weights_only`` too (dcp_pickle, dcp_reader).

Costs (files, staging, background_writer): a background save forks a copy-on-write writer
(``mode="fork"``) after copying accelerator tensors to reused CPU buffers; ``mode="thread"``
copies every tensor into reused buffers and writes from a thread; ``mode="auto"`` (default, or
HPC_CHECKPOINT_MODE) forks for states of 256 MiB and more, where the fork is the cheaper of the
two. A blocking save (the final one, the one on a stop signal) streams the live state to disk in
one pass, without any copy, its checksum computed on a second thread alongside the write.

Parts (one concept each)::

    store.py              CheckpointStore: every rank saves, rank 0 commits
    commit.py             rank 0's renames: a step committed, a killed writer's renames finished, pruning
    reader.py             StoreReader: load the newest valid checkpoint, safe while a writer prunes
    layout.py             names of the entries in a store directory, markers, verification
    files.py              torch.save with a running checksum, weights-only loads
    checksums.py          a file's crc32 and size against its marker, whole or per stored tensor; torch-free
    staging.py            reused CPU buffers for background saves
    background_writer.py  the forked or threaded writer of one background save
    writer_lock.py        one writing job per store
    reports.py            each rank's report of what it wrote, which rank 0 commits from
    rank_lists.py         each rank's list of its files and their checksums, which the marker names
    dcp_engine.py         model and optimizer through torch.distributed.checkpoint (FSDP)
    shardcrc.py           checksums of DCP's data files taken as written; a rank's shards' checksum info
    dcp_index.py          DCP's index in the ranks' parts (saves without collectives), merged where a load needs it
    dcp_claim.py          what each rank wrote in two numbers: the commit checks the parts cover the state
    dcp_reader.py         DCP's reader of a checkpoint: its index read once, every byte checked as read
    dcp_pickle.py         DCP's pickled index read without running pickled code: DCP's types and opcodes only
    dcp_shape.py          whether an unpickled index has the shape of DCP's Metadata; the calls and references it admits
    optim_state.py        an optimizer's state for DCP as it is, without DCP's zero-gradient step
    complete.py           whether a checkpoint a framework wrote (users' scripts) is whole; torch-free
    (hpc.fs.atomic           atomic small-file writes and directory fsync, torch-free)
"""

from typing import Any

# The public names, imported on first use: `complete` (users' scripts' checkpoints, which hpc.status
# reads) must not pay for torch, which the store imports.
PUBLIC = {"CheckpointStore": "store", "StoreLocked": "store", "AUTO_FORK_BYTES": "store", "StoreReader": "reader",
          "PER_RANK_KEY": "reader", "SHARDED_KEY": "reader", "FILES_KEY": "reader",
          "MARKER": "layout", "SHARED": "layout",
          "DCP_METADATA": "layout", "UnsafeCheckpoint": "dcp_pickle"}
__all__ = list(PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in PUBLIC:
        raise AttributeError(f"module 'hpc.checkpoint' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"hpc.checkpoint.{PUBLIC[name]}"), name)
