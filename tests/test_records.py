"""hpc's records on the submission path (hpc.Frozen): set once by their __init__, then refused as a
frozen dataclass refuses, and compared and hashed by their fields where they were before."""
import dataclasses
import pickle

import pytest

import hpc
from hpc.pipeline.arrays import Part
from hpc.pipeline.pipedef import get_pipeline
from hpc.pipeline.request import Request
from hpc.slurm.jobstates import JobRecord


def test_a_record_refuses_every_change_after_its_init():
    req = Request("langsplat", overrides=("a=1",))
    for change in (lambda: setattr(req, "pipeline", "run"), lambda: setattr(req, "other", 1),
                   lambda: delattr(req, "pipeline")):
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field"):
            change()
    assert req.pipeline == "langsplat" and not hasattr(req, "other")
    again = dataclasses.replace(req, pipeline="run")
    assert (again.pipeline, again.overrides, req.pipeline) == ("run", ("a=1",), "langsplat")
    assert pickle.loads(pickle.dumps(req)).overrides == ("a=1",)


def test_the_pipelines_definition_is_frozen():
    pipe = get_pipeline("langsplat")
    with pytest.raises(dataclasses.FrozenInstanceError):
        pipe.name = "other"
    assert isinstance(pipe, hpc.Frozen)


def test_records_compared_by_their_fields_still_are_and_hash_alike():
    record = JobRecord(*[f"v{i}" for i in range(len(dataclasses.fields(JobRecord)))])
    twin = dataclasses.replace(record)
    assert record == twin and hash(record) == hash(twin) and len({record, twin}) == 1
    assert record != dataclasses.replace(record, state="RUNNING") and record != tuple(vars(record).values())
    assert repr(record).startswith("JobRecord(job_id='v0', state='v1', ")
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.state = "RUNNING"
    assert Part((0, 1), (None, None)) == Part((0, 1), (None, None))
    assert hash(Part((0, 1), (None, None))) == hash(Part((0, 1), (None, None)))
