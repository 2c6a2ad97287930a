"""The ranks of one job played in one process, for the tests of a checkpoint's commit and load.

    with recording() as opened:              # the names of the files opened in the block
        save_step(root, 1, world=8, model=model)

Each rank's DcpEngine is told its place (rank r of W) without a process group; ranks 1..W-1 write
their part of a step as the store writes a rank > 0's (its shards, its list of files, its report to
rank 0), then rank 0's store saves and commits it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from hpc.checkpoint import CheckpointStore, layout
from hpc.checkpoint.dcp_engine import DcpEngine
from hpc.checkpoint.writer_lock import generation

_opened: list[str] | None = None  # names of the files opened while it is a list


def _audit(event: str, args: tuple) -> None:
    if event == "open" and _opened is not None and isinstance(args[0], (str, os.PathLike)):
        _opened.append(Path(args[0]).name)


sys.addaudithook(_audit)  # cannot be removed: it records only while _opened is a list


@contextlib.contextmanager
def recording() -> Iterator[list[str]]:
    """The names of the files opened inside the block, in the order they were opened."""
    global _opened
    names: list[str] = []
    _opened = names
    try:
        yield names
    finally:
        _opened = None


@pytest.fixture(autouse=True)
def no_slurm_job(monkeypatch):
    """The store reads a job's attempt from these: the played ranks are no SLURM job's."""
    for name in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)


def model(layers: int = 6) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(layers)))


def engine(rank: int, world: int) -> DcpEngine:
    played = DcpEngine()
    played._rank_world = lambda: (rank, world)  # its place among the ranks, without a process group
    return played


def save_step(root: Path, step: int, world: int, state_of: torch.nn.Module, per_rank: bool = False,
              as_world: dict[int, int] | None = None, models: dict[int, Any] | None = None) -> list[str]:
    """Ranks 1..world-1 write `step`, then rank 0 saves and commits it; the names of the files rank
    0 opened meanwhile. `per_rank`: each rank also keeps {"rank": r}; `as_world`: ranks that think
    the world has another size; `models`: ranks that save another model."""
    tmp = root / layout.name("tmp", step)
    tmp.mkdir(parents=True, exist_ok=True)
    for r in range(1, world):
        part = engine(r, (as_world or {}).get(r, world))
        part.save(tmp, (models or {}).get(r, state_of), blocking=True, collectives=False)
        CheckpointStore(root, rank=r, world_size=world)._write(step, None, {"rank": r} if per_rank else None,
                                                               generation(), shards=part.wait)
    store, first = CheckpointStore(root, rank=0, world_size=world), engine(0, world)

    def shards(directory, blocking):
        first.save(directory, state_of, blocking=True, collectives=False)
        return first.wait
    state = {"step": step, **({"per_rank": {"rank": 0}} if per_rank else {})}
    try:
        with recording() as opened:
            store.save(step, state, blocking=True, sharded=shards)
    finally:
        store.close()
    return opened
