"""A reader of DCP shards holds a read lease: the writer's pruning (keep=1) waits for it.

    python -m pytest -q tests/test_checkpoint_lease.py

One process plays both jobs: a writer store with keep=1 saving model shards through DCP
(hpc.checkpoint.dcp_engine), and an evaluation reader that loads the newest checkpoint, lets the
writer commit (and prune) the next one, and only then reads the shards, as DCP does after load()
returned. flock leases conflict between separate open files, so one process is enough.
"""

from __future__ import annotations

import fcntl
import threading

import pytest
import torch

from hpc.checkpoint import SHARDED_KEY, CheckpointStore, StoreReader, layout
from hpc.checkpoint import reader as reader_module
from hpc.checkpoint.dcp_engine import DcpEngine


def _save(store: CheckpointStore, engine: DcpEngine, model: torch.nn.Module, step: int) -> None:
    with torch.no_grad():
        model.weight.fill_(step)

    def shards(directory, blocking):
        engine.save(directory, model, blocking=True)
        return engine.wait

    store.save(step, {"step": step}, blocking=True, sharded=shards)


@pytest.fixture
def writer(tmp_path):
    store, engine, model = CheckpointStore(tmp_path, keep=1), DcpEngine(), torch.nn.Linear(4, 4)
    yield lambda step: _save(store, engine, model, step)
    store.close()
    engine.close()


def test_a_reader_under_a_lease_loads_the_shards_the_writer_would_have_pruned(tmp_path, writer):
    writer(1)
    reader, target = StoreReader(tmp_path), torch.nn.Linear(4, 4)
    with reader.reading() as state:
        assert state["step"] == 1
        writer(2)  # keep=1: step-1 is beyond keep now, but leased
        assert (tmp_path / "step-1").is_dir()
        DcpEngine().load(state[SHARDED_KEY], target)
    assert bool((target.weight == 1).all())
    writer(3)  # the lease is gone: pruning catches up
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-3"]


def test_without_a_lease_the_same_read_fails(tmp_path, writer):
    """What an evaluation job met before leases: load() returned, the shards went."""
    writer(1)
    state = StoreReader(tmp_path).load()
    writer(2)
    with pytest.raises(Exception):
        DcpEngine().load(state[SHARDED_KEY], torch.nn.Linear(4, 4))


def test_a_reader_never_meets_half_a_checkpoint_while_a_writer_saves_and_prunes(tmp_path, writer):
    writer(1)
    done, errors = threading.Event(), []

    def keep_writing():
        try:
            for step in range(2, 12):
                writer(step)
        except BaseException as err:  # reported by the main thread
            errors.append(err)
        finally:
            done.set()

    thread = threading.Thread(target=keep_writing)
    thread.start()
    reader, loaded = StoreReader(tmp_path), []
    while not done.is_set():
        target = torch.nn.Linear(4, 4)
        with reader.reading() as state:
            DcpEngine().load(state[SHARDED_KEY], target)
        assert bool((target.weight == state["step"]).all())
        loaded.append(state["step"])
    thread.join()
    assert not errors and loaded


def test_a_reader_that_leases_a_step_while_the_writer_deletes_it_moves_to_the_next(tmp_path, writer, monkeypatch):
    """The writer has decided to prune step 1 and is about to delete it when a reader, whose
    listing (taken before step 2 was committed) offers only step 1, leases it. The reader must
    get a checkpoint it loads whole: the writer's check holds the lease, so the reader waits for it,
    finds step 1 gone and loads step 2 (before, it validated step 1 and DCP failed on its files)."""
    writer(1)
    listed, at_delete, go, written = (threading.Event() for _ in range(4))
    real_remove, real_flock, real_candidates = layout.remove, fcntl.flock, reader_module.StoreReader.candidates

    def paused_remove(path):  # the writer, between its check of the lease and its delete, until the
        if path.name == "step-1":  # reader waits for its lease or holds step 1, checked and loaded
            at_delete.set()
            assert go.wait(30)
        real_remove(path)

    def noted_flock(fd, op):  # the reader's lock, as it is, saying when it has to wait
        if op == fcntl.LOCK_SH:
            try:
                return real_flock(fd, op | fcntl.LOCK_NB)
            except BlockingIOError:
                go.set()
        return real_flock(fd, op)

    def listing_then_wait(self):  # the reader's listing comes before the writer's commit of step 2
        found = real_candidates(self)
        if not listed.is_set():
            listed.set()
            assert at_delete.wait(30)
        return found

    monkeypatch.setattr(layout, "remove", paused_remove)
    monkeypatch.setattr(fcntl, "flock", noted_flock)
    monkeypatch.setattr(reader_module.StoreReader, "candidates", listing_then_wait)
    results, errors = [], []

    def read():
        try:
            target = torch.nn.Linear(4, 4)
            with StoreReader(tmp_path).reading() as state:
                go.set()
                assert written.wait(30)  # DCP reads the shards after the writer is done
                DcpEngine().load(state[SHARDED_KEY], target)
            results.append((state["step"], float(target.weight.detach()[0, 0])))
        except BaseException as err:
            errors.append(err)

    thread = threading.Thread(target=read)
    thread.start()
    assert listed.wait(30)
    writer(2)  # keep=1: commits step 2, then prunes step 1 (paused until the reader leases it)
    written.set()
    thread.join(60)
    assert not errors, errors
    assert results == [(2, 2.0)]  # step 1 went while the reader waited for its lease: the next one
    assert not (tmp_path / ".lease-step-1").exists()  # nor is its lease file left behind
