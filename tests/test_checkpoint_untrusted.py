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
import pickle

import pytest
import torch

from hpc.checkpoint import SHARDED_KEY, CheckpointStore, StoreReader
from hpc.checkpoint.dcp_engine import DcpEngine, UnsafeCheckpoint
from hpc.checkpoint.dcp_index import merge_metadata, rank_metadata
from hpc.checkpoint.dcp_pickle import load as load_index
from hpc.checkpoint.files import file_info
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
