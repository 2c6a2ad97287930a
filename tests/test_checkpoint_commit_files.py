"""A committed checkpoint keeps only the files its marker lists, and a kill while the commit
deletes the rest leaves the previous checkpoint the newest valid one.

    python -m pytest -q tests/test_checkpoint_commit_files.py

Two ranks (threads of one process, each with its own store and DCP engine, the engine told its
rank in a world of 2) save through DCP without collectives, as TrainLoop does: each rank writes
its shards, DCP's index of them (__R.metadata, committed as it is), its rank-R.pt and the list
of them (files-R.json); rank 1 reports to rank 0 in rank-1.done. A kill is a BaseException that stops rank 0 where it is, with none of its cleanup.
"""

from __future__ import annotations

import threading

import pytest
import torch

from hpc.checkpoint import SHARDED_KEY, CheckpointStore, StoreReader, layout
from hpc.checkpoint import store as store_module
from hpc.checkpoint.dcp_engine import DcpEngine
from hpc.checkpoint.layout import MARKER

COMMITTED = ["COMPLETE.json", "__0.metadata", "__0_0.distcp", "__1.metadata", "__1_0.distcp", "files-0.json",
             "files-1.json", "rank-0.pt", "rank-1.pt", "shared.pt"]
DELETED = ["rank-1.done"]  # what the commit alone reads


class Killed(BaseException):
    pass


@pytest.fixture(autouse=True)
def _no_slurm_job(monkeypatch):
    for name in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)


def _model(value: float) -> torch.nn.Linear:
    model = torch.nn.Linear(8, 8)
    with torch.no_grad():
        model.weight.fill_(value)
        model.bias.fill_(value)
    return model


def _save(directory, step: int, value: float) -> None:
    """Ranks 0 and 1 save `step`; a rank stopped by Killed leaves what it wrote, as a dead one."""
    stores = [CheckpointStore(directory, rank=r, world_size=2) for r in (0, 1)]
    models, engines = [_model(value), _model(value)], [DcpEngine(), DcpEngine()]

    def run(r):
        engines[r]._rank_world = lambda: (r, 2)  # its place in the 2 ranks, without a process group

        def shards(d, blocking):
            engines[r].save(d, models[r], blocking=True, collectives=False)
            return engines[r].wait
        try:
            stores[r].save(step, {"value": value, "per_rank": {"rank": r}}, blocking=True, sharded=shards)
        except Killed:
            pass

    threads = [threading.Thread(target=run, args=(r,)) for r in (1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for s in stores:
        s.close()  # a dead process's lock goes with it


def _loads(directory, step: int) -> None:
    target = _model(0.0)
    with StoreReader(directory).reading() as state:
        assert state["value"] == step
        DcpEngine().load(state[SHARDED_KEY], target)
    assert bool((target.weight == step).all()) and bool((target.bias == step).all())


def test_a_committed_checkpoint_holds_four_files_per_rank_and_two_more(tmp_path):
    _save(tmp_path, 1, 1.0)
    assert sorted(p.name for p in (tmp_path / "step-1").iterdir()) == COMMITTED  # 4 x 2 ranks + 2
    _loads(tmp_path, 1)


@pytest.mark.parametrize("deleted", range(len(DELETED) + 1))
def test_a_kill_while_the_commit_deletes_leaves_the_previous_checkpoint(tmp_path, monkeypatch, deleted):
    """Killed after `deleted` of the commit's own files are gone (all of them: at the marker)."""
    _save(tmp_path, 1, 1.0)
    real_discard, real_write, gone = layout.discard, store_module.write_bytes, []

    def discard(path):
        if path.name in DELETED and path.parent.name == layout.name("tmp", 2):
            if len(gone) == deleted:
                raise Killed
            gone.append(path.name)
        real_discard(path)

    def write_bytes(path, data, *args, **kwargs):
        if path.name == MARKER:
            raise Killed
        return real_write(path, data, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(layout, "discard", discard)
        m.setattr(store_module, "write_bytes", write_bytes)
        m.setattr(CheckpointStore, "_abandon", lambda self, tmp, generation, err: None)  # no cleanup after a kill
        _save(tmp_path, 2, 2.0)
    assert len(gone) == deleted and not (tmp_path / "step-2").exists()
    _loads(tmp_path, 1)  # the old state, whole
    # The requeued job saves step 2 again, as the next attempt: another generation, so the killed
    # attempt's report left in the temporary directory is not taken for this one's.
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    _save(tmp_path, 2, 2.0)
    assert sorted(p.name for p in (tmp_path / "step-2").iterdir()) == COMMITTED
    _loads(tmp_path, 2)
