"""What one rank's resume costs the filesystem does not grow with the world size that saved.

    python -m pytest -q tests/test_rank_scale.py

A checkpoint as W ranks of an FSDP job commit it (a marker listing every rank's files) is built
in one process at W = 64 and 512: no machine here runs 512 ranks, and what is counted is the
store's work for one rank (stat, lstat, open, listdir and scandir calls), not the shards' bytes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bench.rank_costs import synthetic_checkpoint
from hpc.checkpoint import CheckpointStore, layout
from hpc.checkpoint.dcp_index import rank_metadata

CALLS = {"n": 0, "on": False}


def _audit(event: str, args: tuple) -> None:
    if CALLS["on"] and event in ("open", "os.listdir", "os.scandir"):
        CALLS["n"] += 1


sys.addaudithook(_audit)  # cannot be removed: it counts only while CALLS["on"]


def _operations(root: Path, world: int, monkeypatch) -> int:
    """Filesystem calls of rank 5's resume from the store's side: the candidates, then the load."""
    store = CheckpointStore(root, rank=5, world_size=world)
    for name in ("stat", "lstat"):
        real = getattr(os, name)

        def counting(*args, _real=real, **kwargs):
            if CALLS["on"]:
                CALLS["n"] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(os, name, counting)
    CALLS["n"], CALLS["on"] = 0, True
    try:
        state = store.load(max(store.candidates()))
    finally:
        CALLS["on"] = False
        monkeypatch.undo()
    assert state is not None and state["per_rank"] == {"rng": 5}
    return CALLS["n"]


def test_a_ranks_metadata_operations_at_resume_are_flat_in_the_world_size(tmp_path, monkeypatch):
    small = _operations(synthetic_checkpoint(tmp_path / "w64", 64), 64, monkeypatch)
    large = _operations(synthetic_checkpoint(tmp_path / "w512", 512), 512, monkeypatch)
    print(f"filesystem calls of one rank's resume: {small} at 64 ranks, {large} at 512")
    assert large <= 1.25 * small, (small, large)
    assert small < 40, small  # its own files, the shared ones and the marker: not one per rank


@pytest.mark.parametrize("name", [layout.SHARED, "rank-5.pt"])
def test_a_rank_still_checks_its_own_files_and_the_shared_ones(tmp_path, name):
    root = synthetic_checkpoint(tmp_path, 8)
    (root / "step-1" / name).write_bytes(b"corrupt")
    with pytest.warns(RuntimeWarning, match=name):
        assert CheckpointStore(root, rank=5, world_size=8).load(1) is None


def test_another_ranks_file_is_left_to_the_load_that_reads_it(tmp_path):
    """Not even stat'ed by this rank's store: DCP's reader checks what it reads (test_dcp)."""
    root = synthetic_checkpoint(tmp_path, 8)
    (root / "step-1" / "__3_0.distcp").unlink()
    assert CheckpointStore(root, rank=5, world_size=8).load(1) is not None
    with pytest.warns(RuntimeWarning, match="__3_0.distcp is missing"):
        assert CheckpointStore(root, rank=3, world_size=8).load(1) is None


def test_dcp_index_is_checked_against_the_marker_as_the_load_reads_it(tmp_path):
    """The store only stats the rank's DCP index part (a rank reads it once, in DCP's load): the
    load checks it."""
    import torch

    from hpc.checkpoint.dcp_engine import DcpEngine, ShardCorrupt
    from hpc.checkpoint.layout import marker_files

    store, engine, model = CheckpointStore(tmp_path), DcpEngine(), torch.nn.Linear(4, 4)

    def shards(directory, blocking):
        engine.save(directory, model, blocking=True, collectives=False)
        return engine.wait

    store.save(1, {"step": 1}, blocking=True, sharded=shards)
    store.close()
    index = tmp_path / "step-1" / rank_metadata(0)
    data = bytearray(index.read_bytes())
    data[-2] ^= 0xFF  # same size: only its checksum tells
    index.write_bytes(bytes(data))
    state = CheckpointStore(tmp_path).load(1)
    with pytest.raises(ShardCorrupt, match=r"__0\.metadata does not match its crc32"):
        DcpEngine().load(state["sharded_dir"], torch.nn.Linear(4, 4), files=state["marker_files"])
    with pytest.raises(ShardCorrupt, match=r"__0\.metadata does not match its crc32"):
        DcpEngine().load(index.parent, torch.nn.Linear(4, 4), files=marker_files(index.parent))
