"""The command's own process and the API caller's: python -m hpc.submit freezes what its imports made
(gc.freeze, hpc.submit.settle), hpc.submit() leaves its caller's garbage collector as it found it.

    python -m pytest tests/test_submit_process.py

The debug executor runs the tasks in the submitting process, so the run below also checks that a
whole run completes after the freeze.
"""
import gc
import json
import subprocess
import sys

import pytest

import hpc

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
# The command as `python -m hpc.submit` runs it; at exit, the state of the collector it leaves.
COMMAND = """
import atexit, gc, runpy, sys
atexit.register(lambda: print("GC", gc.isenabled(), gc.get_freeze_count() > 0))
sys.argv = ["hpc.submit", "tests.tiny_pipeline", "--cluster", "debug", "--run-dir", sys.argv[1], "tiny.parts=[0]"]
try:
    runpy.run_module("hpc.submit", run_name="__main__", alter_sys=True)
except SystemExit as done:
    assert not done.code, done.code
"""


@pytest.fixture(autouse=True)
def _no_cluster(monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.chdir(ROOT)  # the stage functions are imported from here (tests.tiny_pipeline)


def test_the_command_freezes_what_its_imports_made_and_its_run_completes(tmp_path):
    out = subprocess.run([sys.executable, "-c", COMMAND, str(tmp_path / "run")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "GC True True"  # collecting again, past the frozen imports
    tasks = json.loads((tmp_path / "run" / "manifest.json").read_text())["tasks"]
    assert sorted(tasks) == ["first", "second[0]"]
    assert (tmp_path / "run" / "second" / "task-0" / "metrics.json").exists()


def test_hpc_submit_leaves_the_callers_collector_as_it_found_it(tmp_path):
    before = (gc.isenabled(), gc.get_freeze_count())
    run = hpc.submit("tests.tiny_pipeline", cluster="debug", run_dir=tmp_path / "run", overrides=["tiny.parts=[0]"])
    assert run.done() and (gc.isenabled(), gc.get_freeze_count()) == before
