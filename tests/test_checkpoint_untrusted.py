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
import re
import tracemalloc

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint import metadata as dcp_md

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


def _text(text):
    raw = text.encode()
    if len(raw) < 256:
        return _op("SHORT_BINUNICODE", bytes([len(raw)]) + raw)
    return _op("BINUNICODE", len(raw).to_bytes(4, "little") + raw)


def _global(module, name):
    return _text(module) + _text(name) + _op("STACK_GLOBAL") + _op("MEMOIZE")


def _get(at):
    return _op("BINGET", bytes([at]))


def _many(setup, each, times):
    """A file that builds `setup` once (memoized as 0, 1, ...), then a list of `times` of what
    `each` builds from it: a few bytes of file each, which must not build more than a few bytes."""
    return _op("PROTO", b"\x04") + setup + _op("EMPTY_LIST") + _op("MARK") + each * times + _op("APPENDS") + _op("STOP")


_INTS = (_op("EMPTY_LIST") + _op("MEMOIZE") + _op("MARK")
         + b"".join(_op("BININT2", i.to_bytes(2, "little")) for i in range(10000)) + _op("APPENDS"))
_KEYS = (_op("EMPTY_DICT") + _op("MEMOIZE") + _op("MARK")
         + b"".join(_text(f"k{i}") + _op("BININT1", b"\x00") for i in range(10000)) + _op("SETITEMS"))
_DCP = "torch.distributed.checkpoint.metadata"
_CRAFTED.update({
    "torch.Size of one list of 10000 ints, 2000 times": _many(
        _INTS + _global("torch", "Size"), _get(1) + _get(0) + _op("TUPLE1") + _op("REDUCE"), 2000),
    "torch.Size.__new__ of one list of 10000 ints, 2000 times": _many(
        _INTS + _global("torch", "Size"), _get(1) + _get(0) + _op("TUPLE1") + _op("NEWOBJ"), 2000),
    "MetadataIndex offset by one list of 10000 ints, 2000 times": _many(
        _INTS + _global(_DCP, "MetadataIndex"), _get(1) + _text("w") + _get(0) + _op("TUPLE2") + _op("REDUCE"), 2000),
    "one state of 10000 keys set on 500 records": _many(
        _KEYS + _global(_DCP, "Metadata"), _get(1) + _op("EMPTY_TUPLE") + _op("NEWOBJ") + _get(0) + _op("BUILD"), 500),
    "a path of 2000 parts, 20000 times": _many(
        _text("a/" * 2000) + _op("MEMOIZE") + _global("pathlib", "PosixPath"),
        _get(1) + _get(0) + _op("TUPLE1") + _op("REDUCE"), 20000),
    # lists of lists, each twice: printed, 2**21 of them, as _MEM_FORMAT_ENCODING's error prints its value
    "an enum's value of 2**21 lists": _op("PROTO", b"\x04") + _op("EMPTY_LIST") + _op("MEMOIZE") + b"".join(
        _op("EMPTY_LIST") + _op("MEMOIZE") + _op("MARK") + _get(k) + _get(k) + _op("APPENDS") for k in range(21))
    + _global(_DCP, "_MEM_FORMAT_ENCODING") + _get(21) + _op("TUPLE1") + _op("REDUCE") + _op("STOP"),
})


def _shared_chunks(tensors=1000, chunks=1000):
    """DCP's Metadata whose tensors all list one list of chunks: a reader that walks each tensor's
    chunks (hpc's merge of the parts) walks tensors x chunks."""
    listed = [dcp_md.ChunkStorageMetadata(torch.Size([i]), torch.Size([1])) for i in range(chunks)]
    values = {f"t{i}": dcp_md.TensorStorageMetadata(dcp_md.TensorProperties(), torch.Size([chunks]), listed)
              for i in range(tensors)}
    return pickle.dumps(dcp_md.Metadata(values, storage_data={}))


_CRAFTED["one list of 1000 chunks in 1000 tensors"] = _shared_chunks()


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


def _called(func, *args):
    return pickle.dumps(Reduced(func, *args), protocol=4)


def _new_metadata(*then):
    """A file that makes DCP's Metadata (memo 0) as pickle does, then does `then` with it."""
    return _op("PROTO", b"\x04") + _global(_DCP, "Metadata") + _op("EMPTY_TUPLE") + _op("NEWOBJ") + b"".join(then) \
        + _op("STOP")


_VERSION = _op("EMPTY_DICT") + _text("version") + _text("1") + _op("SETITEM")
# Each call and record an index names, with arguments DCP never writes: refused before it builds.
_CHECKED = {
    "torch.Size of 65 dimensions": (_called(torch.Size, (1,) * 65), "torch.Size of a tuple"),
    "torch.Size of a negative size": (_called(torch.Size, (-1,)), "torch.Size of a tuple"),
    "torch.Size of strings": (_called(torch.Size, ["a"]), "torch.Size of a list"),
    "a layout named by a list": (_called(torch.serialization._get_layout, ["torch.strided"]),
                                 "layout named by a list"),
    "a memory format numbered by a string": (_called(dcp_md._MEM_FORMAT_ENCODING, "0"),
                                             "memory format numbered by a str"),
    "a call of DCP's MetadataIndex": (_called(dcp_md.MetadataIndex, "w", list(range(100))), "a call of MetadataIndex"),
    "a record from arguments": (_op("PROTO", b"\x04") + _global(_DCP, "Metadata") + _op("BININT1", b"\x01")
                                + _op("TUPLE1") + _op("NEWOBJ") + _op("STOP"), "not a DCP record from no arguments"),
    "a record's state that is not its fields": (
        _new_metadata(_op("EMPTY_DICT"), _text("crafted"), _op("NONE"), _op("SETITEM"), _op("BUILD")),
        "a dict as the state of a Metadata"),
    "a long string referenced twice": (pickle.dumps(["x" * 5000] * 2, protocol=4),
                                       "a second reference to a string of 5000 characters"),
    "a record referenced before its fields are set": (_new_metadata(_op("MEMOIZE"), _get(1)),
                                                      "one Metadata before its fields are set"),
    "a record's fields set twice": (_new_metadata(_VERSION, _op("BUILD"), _VERSION, _op("BUILD")), "set twice"),
}


@pytest.mark.parametrize("what", list(_CHECKED))
def test_a_call_or_record_dcp_never_writes_is_refused(what, tmp_path):
    """Each check by itself: none of these shares a list, which the memo's check refuses first."""
    data, expected = _CHECKED[what]
    with pytest.raises(UnsafeCheckpoint, match=re.escape(expected)) as err:
        load_index(io.BytesIO(data), tmp_path / "x")
    assert "\n" not in str(err.value) and str(tmp_path / "x") in str(err.value)
