"""Loading a checkpoint someone else wrote never runs code it names, DCP's files included.

    python -m pytest -q tests/test_checkpoint_untrusted.py

The author of a crafted checkpoint also writes its marker, so each file here is given the
checksum the marker lists: only the loading itself stands in the way. The payload touches a file;
the tests check that the file never appears and that the refusal is one line with the file's name.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pathlib
import pickle
import tracemalloc

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpc.checkpoint import SHARDED_KEY, CheckpointStore, StoreReader, dcp_pickle
from hpc.checkpoint.dcp_engine import DcpEngine, UnsafeCheckpoint
from hpc.checkpoint.dcp_index import holes, merge, merge_metadata, rank_metadata
from hpc.checkpoint.dcp_pickle import load as load_index
from hpc.checkpoint.checksums import file_info
from hpc.checkpoint.layout import MARKER, marker_files


class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _objects():
    model = torch.nn.Linear(4, 4)
    model.register_buffer("count", torch.zeros(2, dtype=torch.int64))
    model.register_buffer("low", torch.zeros(2, dtype=torch.bfloat16))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return model, opt


@pytest.fixture
def step(tmp_path):
    """A committed checkpoint with DCP shards, saved as TrainLoop saves (no collectives)."""
    store, engine, (model, opt) = CheckpointStore(tmp_path / "store"), DcpEngine(), _objects()

    def shards(directory, blocking):
        engine.save(directory, model, opt, blocking=True, collectives=False)
        return engine.wait

    store.save(1, {"step": 1}, blocking=True, sharded=shards)
    store.close()
    return tmp_path / "store" / "step-1"


def _replace(step_dir, name, data):
    """Write `data` as `name` in a committed checkpoint, with the marker's checksum to match."""
    (step_dir / name).write_bytes(data)
    marker = json.loads((step_dir / MARKER).read_text())
    marker["files"][name] = file_info(step_dir / name)
    (step_dir / MARKER).write_text(json.dumps(marker))


def _refused(err, path, touched):
    message = str(err.value)
    assert "\n" not in message and str(path) in message and "HINT" in message
    assert not touched.exists(), "the checkpoint's pickled code ran"


def test_a_crafted_dcp_index_is_refused_through_a_leased_read(step, tmp_path):
    """A merged .metadata (checkpoints saved through DCP's collectives, or before the ranks' parts
    were committed) is read in place of the parts: refused alike."""
    touched = tmp_path / "ran"
    _replace(step, ".metadata", pickle.dumps(Payload(touched)))
    with pytest.raises(UnsafeCheckpoint) as err:
        with StoreReader(step.parent).reading() as state:
            DcpEngine().load(state[SHARDED_KEY], *_objects())
    _refused(err, step / ".metadata", touched)


def test_a_crafted_dcp_index_is_refused_by_the_engine(step, tmp_path):
    touched = tmp_path / "ran"
    _replace(step, ".metadata", pickle.dumps(Payload(touched)))
    with pytest.raises(UnsafeCheckpoint) as err:
        DcpEngine().load(step, *_objects(), files=marker_files(step))
    _refused(err, step / ".metadata", touched)


def test_a_crafted_rank_index_part_is_refused_by_the_load(step, tmp_path):
    """A save without collectives commits no merged index: a load reads the ranks' parts,
    __R.metadata, each through the same unpickler."""
    touched = tmp_path / "ran"
    assert not (step / ".metadata").exists()
    _replace(step, rank_metadata(0), pickle.dumps(Payload(touched)))
    with pytest.raises(UnsafeCheckpoint) as err:
        DcpEngine().load(step, *_objects(), files=marker_files(step))
    _refused(err, step / rank_metadata(0), touched)


def test_a_crafted_value_among_the_shards_is_refused(step, tmp_path):
    """DCP stores non-tensor values (an optimizer's lr) as torch.save's bytes and loads them with
    weights_only=False: the index is made to point one of them at a crafted file."""
    touched = tmp_path / "ran"
    payload = io.BytesIO()
    torch.save(Payload(touched), payload)
    with open(step / rank_metadata(0), "rb") as fh:
        index = pickle.load(fh)
    where = next(k for k in index.storage_data if k.fqn == "optimizer.param_groups.0.lr")
    index.storage_data[where] = dataclasses.replace(index.storage_data[where], relative_path="crafted.distcp",
                                                    offset=0, length=len(payload.getvalue()))
    _replace(step, "crafted.distcp", payload.getvalue())
    _replace(step, rank_metadata(0), pickle.dumps(index))
    with pytest.raises(UnsafeCheckpoint) as err:
        DcpEngine().load(step, *_objects(), files=marker_files(step))
    _refused(err, step / "crafted.distcp", touched)


def test_a_crafted_rank_index_is_refused_at_the_commit(tmp_path):
    touched = tmp_path / "ran"
    parts = tmp_path / "parts"
    parts.mkdir()
    DcpEngine().save(parts, *_objects(), blocking=True, collectives=False)
    (parts / rank_metadata(1)).write_bytes(pickle.dumps(Payload(touched)))
    with pytest.raises(UnsafeCheckpoint) as err:
        merge_metadata(parts, 2)
    _refused(err, parts / rank_metadata(1), touched)


def test_a_dotted_name_cannot_reach_past_an_admitted_class(tmp_path):
    """pickle resolves 'A.b.c' attribute by attribute: an admitted class must not lead elsewhere."""
    module, name = b"torch.distributed.checkpoint.metadata", b"Metadata.__init__.__globals__"
    data = (b"\x80\x04" + b"\x8c" + bytes([len(module)]) + module + b"\x8c" + bytes([len(name)]) + name
            + b"\x93.")
    with pytest.raises(UnsafeCheckpoint, match="Metadata.__init__"):
        load_index(io.BytesIO(data), tmp_path / "x")


def test_what_dcp_writes_loads_as_pickle_loads_it(step):
    with open(step / rank_metadata(0), "rb") as fh:
        plain = pickle.load(fh)
    with open(step / rank_metadata(0), "rb") as fh:
        assert load_index(fh, step / rank_metadata(0)) == plain
    model, opt = _objects()
    DcpEngine().load(step, model, opt, files=marker_files(step))
    assert model.low.dtype == torch.bfloat16 and opt.param_groups[0]["lr"] == 0.01


class Reduced:
    """Pickles as `func(*args)`: what a crafted index asks the reader to call."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _op(name, arg=b""):
    return getattr(pickle, name) + arg


_HUGE = (2**40).to_bytes(8, "little")
_LONG = "x" * 4000
# Files a few bytes long that ask the reader for gigabytes, or for state set on torch's own classes.
_CRAFTED = {
    "bytearray(2**40)": pickle.dumps(Reduced(bytearray, 2**40), protocol=4),
    "bytes of 2**40 announced": _op("PROTO", b"\x04") + _op("BINBYTES8", _HUGE) + b"x" + _op("STOP"),
    "a bytearray of 2**40 announced": _op("PROTO", b"\x05") + _op("BYTEARRAY8", _HUGE) + b"x" + _op("STOP"),
    "the memo's entry 2**24": _op("PROTO", b"\x04") + _op("NONE") + _op("LONG_BINPUT", (2**24).to_bytes(4, "little"))
    + _op("STOP"),
    "one path from 10000 references to a long string": pickle.dumps(Reduced(pathlib.PosixPath, *[_LONG] * 10000),
                                                                      protocol=4),
}


def _state_on_a_class():
    """STACK_GLOBAL Metadata, then BUILD with (None, {"crafted": 1}): setattr(Metadata, ...)."""
    module, name = b"torch.distributed.checkpoint.metadata", b"Metadata"
    return (b"\x80\x04" + _op("SHORT_BINUNICODE", bytes([len(module)]) + module)
            + _op("SHORT_BINUNICODE", bytes([len(name)]) + name) + _op("STACK_GLOBAL") + _op("NONE")
            + _op("EMPTY_DICT") + _op("SHORT_BINUNICODE", b"\x07crafted") + _op("BININT1", b"\x01")
            + _op("SETITEM") + _op("TUPLE2") + _op("BUILD") + _op("STOP"))


_CRAFTED["state set on DCP's Metadata class"] = _state_on_a_class()


def _bounded(data, path):
    """load_index(data): (its result or its exception, the peak of memory the reader allocated)."""
    tracemalloc.start()
    try:
        result = load_index(io.BytesIO(data), path)
    except Exception as err:  # noqa: BLE001 - the test names what it got
        result = err
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return result, peak


@pytest.mark.parametrize("what", list(_CRAFTED))
def test_a_crafted_index_allocates_nothing_and_is_refused(what, step):
    """Through a load, as a user's job meets it: one line naming the file, never MemoryError, a
    gigabyte reserved or torch's classes changed."""
    from torch.distributed.checkpoint.metadata import Metadata

    _replace(step, rank_metadata(0), _CRAFTED[what])
    tracemalloc.start()
    try:
        with pytest.raises(UnsafeCheckpoint) as err:
            DcpEngine().load(step, *_objects(), files=marker_files(step))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(err.value)
    assert "\n" not in message and str(step / rank_metadata(0)) in message and "HINT" in message
    assert peak < 32 * 2**20, f"the reader allocated {peak / 2**20:.0f} MiB for {what}"
    assert not hasattr(Metadata, "crafted")


def test_an_index_over_the_cap_is_refused_unread(monkeypatch, step):
    monkeypatch.setattr(dcp_pickle, "MAX_BYTES", 1000)
    with pytest.raises(UnsafeCheckpoint, match="over 1000 bytes"):
        DcpEngine().load(step, *_objects(), files=marker_files(step))


def _works(index):
    """What hpc's loads do with an index: merge it, find its holes."""
    merge([index, index])
    holes(index)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=400))
def test_any_bytes_load_as_an_index_or_are_refused(data, tmp_path):
    result, peak = _bounded(data, tmp_path / "x")
    assert isinstance(result, UnsafeCheckpoint) or _works(result) is None, repr(result)
    assert peak < 4 * 2**20


@pytest.fixture(scope="module")
def real_index(tmp_path_factory):
    parts = tmp_path_factory.mktemp("parts")
    DcpEngine().save(parts, *_objects(), blocking=True, collectives=False)
    return (parts / rank_metadata(0)).read_bytes()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 12),
                                st.binary(max_size=12)), min_size=1, max_size=4))
def test_a_mutated_real_index_loads_or_is_refused(edits, real_index, tmp_path):
    """DCP's own index with bytes replaced, cut or spliced in (an opcode with a length, a memo
    number): a load that hpc's merge reads, or UnsafeCheckpoint; never another exception."""
    data = bytearray(real_index)
    for where, cut, spliced in edits:
        at = int(where * len(data))
        data[at:at + cut] = spliced
    result, peak = _bounded(bytes(data), tmp_path / "x")
    assert isinstance(result, UnsafeCheckpoint) or _works(result) is None, repr(result)
    assert peak < 16 * 2**20
