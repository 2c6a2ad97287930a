"""The tests' own pipelines, registered by name for a test module's jobs on the local cluster.

    tiny = use_pipelines(tiny="tests.tiny_pipeline")   # an autouse fixture of the test module

Every SLURM test that submits one of tests/*_pipeline.py does the same two steps: name the module in
hpc.pipeline.plan.PIPELINES, and submit from the checkout, since the jobs import tests.X from the
submission directory.
"""
from pathlib import Path

import pytest

from hpc.pipeline import plan

ROOT = Path(__file__).resolve().parents[2]


def register(monkeypatch, **modules: str) -> None:
    """Each name -> its module ('tests.X' or 'tests.X:ATTR'), and the checkout as the working directory."""
    for name, module in modules.items():
        monkeypatch.setitem(plan.PIPELINES, name, module)
    monkeypatch.chdir(ROOT)  # jobs import tests.* from the submission directory


def use_pipelines(**modules: str):
    """An autouse fixture that registers `modules` (register) for every test of the module."""
    @pytest.fixture(autouse=True)
    def pipelines(monkeypatch):
        """The test module's pipelines, by name; the checkout as the working directory."""
        register(monkeypatch, **modules)
    return pipelines
