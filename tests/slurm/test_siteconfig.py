"""MaxArraySize is asked of `scontrol show config` once per slurm.conf: the next submission reads the
kept answer, and a changed slurm.conf (then `scontrol reconfigure`) is asked again.

    python -m pytest tests/slurm/test_siteconfig.py -m slurm
"""
import json
import os
import re
import shutil
import subprocess

import pytest

from hpc.fs import filestamp
from tests.slurm.test_arrays import ONE_RANK, tiny  # noqa: F401 (tiny: the pipeline, registered for each test)
from tests.slurm.test_pipeline import run_tiny

pytestmark = pytest.mark.slurm


def show_config_calls(tmp_path, monkeypatch):
    """PATH with a scontrol that logs its arguments; returns how many `show config` calls it saw."""
    shims, log = tmp_path / "shims", tmp_path / "scontrol.log"
    shims.mkdir()
    (shims / "scontrol").write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {shutil.which("scontrol")} "$@"\n')
    (shims / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{os.environ['PATH']}")
    return lambda: log.read_text().splitlines().count("show config") if log.exists() else 0


def cancel(run_dir):
    ids = [t["job_id"] for t in json.loads((run_dir / "manifest.json").read_text())["tasks"].values()]
    subprocess.run(["scancel", *ids], check=False)


def test_max_array_size_is_asked_once_per_slurm_conf(slurm_cluster, tmp_path, monkeypatch, capsys):
    calls = show_config_calls(tmp_path, monkeypatch)
    monkeypatch.setenv("HPC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(filestamp, "RACY_NS", 0)  # the session cluster's slurm.conf may be seconds old
    for name in ("a", "b"):
        run_tiny(tmp_path / name, "tiny.parts=[0,1,2,3,4,5]", *ONE_RANK)
        cancel(tmp_path / name)
    assert calls() == 1  # the second submission read the answer kept by the first
    conf = slurm_cluster.conf
    original = conf.read_text()
    monkeypatch.setattr(filestamp, "RACY_NS", 2_000_000_000)
    try:
        conf.write_text(re.sub(r"(?m)^MaxArraySize=\d+\n", "", original) + "MaxArraySize=4\n")
        subprocess.run(["scontrol", "reconfigure"], check=True)
        capsys.readouterr()
        for name in ("c", "d"):
            run_tiny(tmp_path / name, "tiny.parts=[0,1,2,3,4,5]", *ONE_RANK)
            cancel(tmp_path / name)
            assert "more than the cluster's MaxArraySize 4: submitted as 2 arrays" in capsys.readouterr().out
        assert calls() == 3  # the changed file was asked again, and while it is that fresh, every time
    finally:
        conf.write_text(original)
        subprocess.run(["scontrol", "reconfigure"], check=True)
