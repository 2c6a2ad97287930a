"""The code snapshot as a submission meets it: from an empty directory, and after a submission killed mid-copy.

    python -m pytest tests/test_snapshot_submit.py -n 0

Each submission is `python -m hpc.submit` in a process of its own, from a directory outside any
git checkout, with the pipeline's module elsewhere on PYTHONPATH: the snapshot copies the working
directory (hpc.rundir.snapshot). The local executor runs the one stage.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc.rundir.snapcache import STORE
from tests.midcopy import kill_mid_copy

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = """
import hpc

def one(ctx):
    (ctx.stage_dir / "ran.txt").write_text("yes")

PIPE = hpc.define("lonely", hpc.stage(one, cpus_per_task=1, time_min=5))
"""
# the submission of the test below, killed once it has copied one file of the snapshot
SLOW = """
import sys, time
from hpc import submit
from hpc.rundir import treecopy
real = treecopy.copy_one
def slow(*args):
    real(*args)
    time.sleep(60)
treecopy.copy_one = slow
sys.exit(submit.main(sys.argv[1:]))
"""


@pytest.fixture
def where(tmp_path):
    """(the directory to submit from, empty; the environment with the pipeline's module on PYTHONPATH)."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "lonelypipe.py").write_text(PIPELINE)
    (tmp_path / "cwd").mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path / "mods")]),
           "HPC_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    env.pop("SLURM_CONF", None)
    return tmp_path / "cwd", env


def submit(cwd, env, run_dir):
    return subprocess.run([sys.executable, "-m", "hpc.submit", "lonelypipe:PIPE", "--cluster", "local", "--run-dir", str(run_dir)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_an_empty_working_directory_is_an_empty_snapshot(where, tmp_path):
    cwd, env = where
    out = submit(cwd, env, tmp_path / "run")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "0 files" in out.stdout, out.stdout
    (code,) = [p for p in (tmp_path / STORE).iterdir() if p.is_dir()]  # the run root's store
    assert list(code.iterdir()) == [] and (tmp_path / "run" / "one" / "ran.txt").read_text() == "yes"
    assert list(cwd.iterdir()) == []


def test_a_snapshot_killed_mid_copy_leaves_no_temporary_after_the_next(where, tmp_path):
    cwd, env = where
    for i in range(3):
        (cwd / f"f{i}.py").write_text(f"X = {i}\n")
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", SLOW, "lonelypipe:PIPE", "--cluster", "local", "--run-dir",
                             str(run)], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    store = tmp_path / STORE  # the run root's store
    kill_mid_copy(proc, store)
    assert list(store.glob(".tmp-*"))  # what the kill left
    out = submit(cwd, env, run)
    assert out.returncode == 0, out.stderr[-2000:]
    assert list(store.glob(".tmp-*")) == [], sorted(os.listdir(store))
    assert "3 files" in out.stdout and (run / "one" / "ran.txt").read_text() == "yes"
