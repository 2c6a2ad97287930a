"""Submit limits (hpc.slurm.limits): sacctmgr's answer read into the strictest per-user limit, and a
plan checked against it before anything is submitted.

    python -m pytest tests/test_limits.py
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hpc.cluster import files
from hpc.cluster import layout as L
from hpc.slurm import limits

# sacctmgr -n -P with commands() on stdin, as the sandbox cluster answers it (python -m hpc.cluster
# up --limits --max-submit-jobs 3): root has an association in account root and one in hpc.
SANDBOX = """\
sacctmgr: show user where name=root format=User,DefaultAccount
root|root
sacctmgr: show assoc where user=root format=Account,User,Partition,MaxSubmit,QOS,DefaultQOS
hpc|root||||
root|root|||normal|
sacctmgr: show qos format=Name,MaxSubmitPU
normal|3
sacctmgr: 
"""


def test_reads_the_qos_limit_of_the_default_account():
    assert limits.parse(SANDBOX) == limits.SubmitLimit(3, "QOS normal's MaxSubmitJobsPerUser")


def test_the_association_limit_when_stricter_and_the_default_qos():
    text = SANDBOX.replace("root|root|||normal|", "root|root||2|normal,long|long").replace(
        "normal|3", "normal|3\nlong|1")
    assert limits.parse(text) == limits.SubmitLimit(1, "QOS long's MaxSubmitJobsPerUser")
    text = SANDBOX.replace("root|root|||normal|", "root|root||2|normal|")
    assert limits.parse(text) == limits.SubmitLimit(2, "the association of account root's MaxSubmitJobs")


def test_no_limit_set_and_partition_rows_ignored():
    assert limits.parse(SANDBOX.replace("normal|3", "normal|")) is None
    assert limits.parse(SANDBOX.replace("normal|3", "normal|").replace(
        "hpc|root||||", "hpc|root|high|1||")) is None
    assert limits.parse("") is None


def test_check_refuses_with_the_numbers_in_one_line():
    limit = limits.SubmitLimit(3, "QOS normal's MaxSubmitJobsPerUser")
    line = limits.check([1, 4], limit, 0)
    assert line.startswith("this run needs 5 jobs in the queue at once (1 + an array of 4); "
                           "QOS normal's MaxSubmitJobsPerUser allows 3 per user and you have 0 queued")
    assert "\n" not in line and "HINT:" in line
    assert limits.check([1, 4], limits.SubmitLimit(5, "x"), 0) is None
    assert "you have 4 queued or running, so 1 more fit" in limits.check([1, 1], limits.SubmitLimit(5, "x"), 4)
    assert limits.check([9], None, 100) is None


def _fake_sacctmgr(tmp_path: Path, monkeypatch, script: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    fake = bin_dir / "sacctmgr"
    fake.write_text(f"#!/bin/sh\necho x >> {calls}\n{script}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HPC_CACHE_DIR", str(tmp_path / "cache"))
    return calls


def test_a_site_without_accounting_is_asked_once(tmp_path, monkeypatch):
    calls = _fake_sacctmgr(tmp_path, monkeypatch, "echo 'sacctmgr: error: Problem talking to the database' >&2; exit 1")
    assert limits.submit_limit() is None
    assert limits.submit_limit() is None
    assert calls.read_text().count("x") == 1


def test_the_limit_is_read_with_one_call_and_kept(tmp_path, monkeypatch):
    calls = _fake_sacctmgr(tmp_path, monkeypatch, "cat >/dev/null; printf '%s' \"$ANSWER\"")
    monkeypatch.setenv("ANSWER", SANDBOX)
    assert limits.submit_limit().jobs == 3
    assert limits.submit_limit().jobs == 3
    assert calls.read_text().count("x") == 1


def test_cluster_with_limits_enforces_them_in_slurm_conf():
    c = L.ClusterLayout.create("/tmp/cluster-a", limits=True, max_submit_jobs=3)
    assert "AccountingStorageEnforce=associations,limits,qos\n" in files.render_slurm_conf(c)
    assert "AccountingStorageEnforce" not in files.render_slurm_conf(L.ClusterLayout.create("/tmp/cluster-a"))
    with pytest.raises(ValueError, match="HINT"):
        L.ClusterLayout.create("/tmp/cluster-a", limits=True, accounting=False)
    with pytest.raises(ValueError, match="HINT"):
        L.ClusterLayout.create("/tmp/cluster-a", max_submit_jobs=3)
