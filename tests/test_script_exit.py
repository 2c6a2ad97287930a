"""A user's script's end under hpc's `run` wrapper (hpc.scripts.scriptexit): a script that ended
normally and then died in its interpreter's teardown (SIGABRT, as gloo's threads make a script that
never destroyed its process group die now and then) counts as a normal exit; one that failed never
does; a process group left initialised is destroyed at exit.

    python -m pytest tests/test_script_exit.py -q

The crash is the C library's exit functions calling abort(): after Python's teardown and after hpc's
exit function, where C++'s destructors run. tests/slurm/test_script_exit.py runs it under SLURM.
"""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hpc import submit
from hpc.rundir.run import RunDir
from hpc.scripts import hooks, scriptexit

ROOT = Path(__file__).resolve().parents[1]
ABORT_AT_EXIT = "import ctypes\nlibc = ctypes.CDLL('libc.so.6')\nlibc.on_exit(libc.abort, None)\n"


def as_the_wrapper_starts_it(tmp_path: Path, body: str, env: dict = {}) -> tuple:
    """(exit status, status as the wrapper counts it, the record's contents or None)."""
    folder = tmp_path / "exit"
    folder.mkdir()
    (tmp_path / "script.py").write_text(body)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "script.py")], stderr=subprocess.DEVNULL, env={
        **os.environ, "PYTHONPATH": os.pathsep.join([str(hooks.SITE), str(ROOT)]), scriptexit.ENV: str(folder),
        **env})
    code = proc.wait(timeout=120)
    record = folder / f"{proc.pid}.json"
    return code, scriptexit.status(code, str(folder), proc.pid, 0), \
        json.loads(record.read_text()) if record.exists() else None


@pytest.mark.parametrize("ending, counted", [("", 0), ("import sys\nsys.exit(3)\n", -6),
                                             ("raise ValueError('the script failed')\n", -6)])
def test_only_a_script_that_ended_normally_counts_a_crash_at_exit_as_its_normal_end(tmp_path, ending, counted):
    code, seen, _ = as_the_wrapper_starts_it(tmp_path, ABORT_AT_EXIT + ending)
    assert (code, seen) == (-6, counted)


def test_a_failed_script_keeps_its_own_status(tmp_path):
    assert as_the_wrapper_starts_it(tmp_path, "import sys\nsys.exit(3)\n")[:2] == (3, 3)


def test_a_process_group_left_initialised_is_destroyed_at_exit(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, seen, record = as_the_wrapper_starts_it(
        tmp_path, "import torch.distributed as dist\ndist.init_process_group('gloo')\n",
        {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "1", "RANK": "0"})
    assert (code, seen, record["group"]) == (0, 0, "destroyed")


def test_a_run_whose_script_dies_at_exit_after_its_work_completes(tmp_path, monkeypatch, capfd):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("open('trained', 'w').close()\n" + ABORT_AT_EXIT)
    assert submit.main(["run", "--cluster", "local", "--run-dir", str(tmp_path / "run"), "--",
                        sys.executable, "train.py"]) == 0
    assert RunDir(tmp_path / "run").is_done("main"), capfd.readouterr().err[-3000:]
