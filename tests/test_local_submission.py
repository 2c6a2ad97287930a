"""When a submission returns: on SLURM at once, on the local executor once every stage has run.

    python -m pytest tests/test_local_submission.py -q

Without a scheduler nothing holds a later stage until the earlier one has ended, so the submitting
process does, and hpc.submit(cluster="local") returns a finished run. Every place that tells users
when a submission returns says so.
"""
import re
import time
from pathlib import Path

import pytest

import hpc
from hpc import api
from hpc.monitor.status import done_info
from hpc.rundir.run import RunDir

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_cluster(monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.chdir(ROOT)  # the jobs import tests.tiny_pipeline from the snapshot of this directory


def test_a_local_submission_returns_once_every_stage_has_ended(tmp_path):
    started = time.monotonic()
    run = hpc.submit("tests.tiny_pipeline", cluster="local", run_dir=tmp_path / "run",
                     overrides=["tiny.parts=[0]", "tiny.sleep_s=2"])
    took = time.monotonic() - started
    assert [(r["task"], r["state"]) for r in run.status()] == [("first", "COMPLETED"), ("second[0]", "COMPLETED")]
    assert took >= 4, f"returned after {took:.1f} s, before both 2 s stages ran"
    first, second = (done_info(RunDir(run.path), stage, item) for stage, item in (("first", None), ("second", 0)))
    assert second["started"] >= first["finished"]  # one after another, as the docs say


def _sentences(text):
    return re.split(r"(?<=[.;])\s+", " ".join(text.split()))


@pytest.mark.parametrize("where", ["README.md", "docs/pipelines.md", "hpc.submit()"])
def test_the_docs_say_when_a_submission_returns(where):
    """'returns at once' only of SLURM, and what the local executor does, where users read it."""
    text = api.submit.__doc__ if where == "hpc.submit()" else (ROOT / where).read_text()
    said = [s for s in _sentences(text) if re.search(r"returns? at once|returns once the scheduler", s, re.I)]
    assert said and all("SLURM" in s for s in said), said
    local = [s for s in _sentences(text) if "local executor" in s]
    assert any(re.search(r"returns? only when the last stage has ended|when the last has ended|"
                         r"once every stage has run", s) for s in local), local
