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
from hpc.fs import filestamp
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
    assert limits.parse(SANDBOX) == [limits.SubmitLimit(3, "QOS normal's MaxSubmitJobsPerUser", "qos", "normal", "root")]


def test_the_association_limit_when_stricter_and_the_default_qos():
    text = SANDBOX.replace("root|root|||normal|", "root|root||2|normal,long|long").replace(
        "normal|3", "normal|3\nlong|1")
    assert limits.parse(text) == [limits.SubmitLimit(1, "QOS long's MaxSubmitJobsPerUser", "qos", "long", "root"),
                                  limits.SubmitLimit(2, "the association of account root's MaxSubmitJobs",
                                                     "account", "long", "root")]
    text = SANDBOX.replace("root|root|||normal|", "root|root||2|normal|")
    assert limits.parse(text)[0] == limits.SubmitLimit(2, "the association of account root's MaxSubmitJobs",
                                                       "account", "normal", "root")


def test_no_limit_set_and_partition_rows_ignored():
    assert limits.parse(SANDBOX.replace("normal|3", "normal|")) == []
    assert limits.parse(SANDBOX.replace("normal|3", "normal|").replace(
        "hpc|root||||", "hpc|root|high|1||")) == []
    assert limits.parse("") == []


def test_check_refuses_with_the_numbers_in_one_line():
    limit = limits.SubmitLimit(3, "QOS normal's MaxSubmitJobsPerUser")
    line = limits.check([1, 4], limit, 0)
    assert line.startswith("this run needs 5 jobs in the queue at once (1 + an array of 4); "
                           "QOS normal's MaxSubmitJobsPerUser allows 3 per user and you have 0 queued")
    assert "\n" not in line and "HINT:" in line
    assert limits.check([1, 4], limits.SubmitLimit(5, "x"), 0) is None
    assert "you have 4 queued or running, so 1 more fit" in limits.check([1, 1], limits.SubmitLimit(5, "x"), 4)
    assert limits.check([9], None, 100) is None


def _fake_client(tmp_path: Path, monkeypatch, name: str, script: str) -> Path:
    """`name` on PATH running `script`; the file it returns gets one line (its arguments) per call."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / f"{name}.calls"
    calls.touch()
    fake = bin_dir / name
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n{script}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HPC_CACHE_DIR", str(tmp_path / "cache"))
    return calls


def _fake_sacctmgr(tmp_path: Path, monkeypatch, script: str = "cat >/dev/null; printf '%s' \"$ANSWER\"") -> Path:
    return _fake_client(tmp_path, monkeypatch, "sacctmgr", script)


def _calls(path: Path) -> list:
    return path.read_text().splitlines()


def test_a_site_without_accounting_is_asked_once(tmp_path, monkeypatch):
    calls = _fake_sacctmgr(tmp_path, monkeypatch, "echo 'sacctmgr: error: Problem talking to the database' >&2; exit 1")
    assert limits.submit_limits() == []
    assert limits.submit_limits() == []
    assert len(_calls(calls)) == 1


def test_the_limit_is_read_with_one_call_and_kept(tmp_path, monkeypatch):
    calls = _fake_sacctmgr(tmp_path, monkeypatch)
    monkeypatch.setenv("ANSWER", SANDBOX)
    assert limits.submit_limits()[0].jobs == 3
    assert limits.submit_limits()[0].jobs == 3
    assert len(_calls(calls)) == 1


# squeue -h -r -u USER [-q QOS | -A ACCOUNT] ...: the user has 10 jobs in QOS normal and 90 in QOS
# long, all in account root.
SQUEUE = """case "$*" in
  *"-q normal"*) seq 10 ;;
  *"-q long"*) seq 90 ;;
  *) seq 100 ;;
esac"""


def test_only_the_jobs_in_the_limits_qos_count_and_another_qos_is_not_checked(tmp_path, monkeypatch):
    _fake_sacctmgr(tmp_path, monkeypatch)
    monkeypatch.setenv("ANSWER", SANDBOX.replace("normal|3", "normal|100\nlong|"))
    squeue = _fake_client(tmp_path, monkeypatch, "squeue", SQUEUE)
    limits.refuse_past_limit([20], [{"qos": None}])  # 10 in normal + 20: fits under normal's 100
    assert " -q normal " in _calls(squeue)[0]
    limits.refuse_past_limit([20], [{"qos": "long"}])  # normal's limit does not apply: not asked
    limits.refuse_past_limit([20, 1], [{"extra": {"qos": "long"}}, {"account": "other"}])
    assert len(_calls(squeue)) == 1
    with pytest.raises(limits.LimitError, match="this run needs 91 jobs.*you have 10 queued"):
        limits.refuse_past_limit([91, 20], [{}, {"qos": "long"}])


def test_an_association_limit_counts_the_jobs_of_its_account(tmp_path, monkeypatch):
    _fake_sacctmgr(tmp_path, monkeypatch)
    monkeypatch.setenv("ANSWER", SANDBOX.replace("root|root|||normal|", "root|root||95|normal,long|"))
    squeue = _fake_client(tmp_path, monkeypatch, "squeue", 'case "$*" in *"-A root"*) seq 50 ;; *) seq 100 ;; esac')
    limits.refuse_past_limit([40], [{"qos": "long"}])  # 50 in account root + 40: fits under 95
    limits.refuse_past_limit([90], [{"account": "other"}])
    assert len(_calls(squeue)) == 1 and " -A root " in _calls(squeue)[0]
    with pytest.raises(limits.LimitError, match="account root's MaxSubmitJobs allows 95"):
        limits.refuse_past_limit([46], [{"extra": {"qos": "long"}}])


def test_a_failing_squeue_leaves_the_count_unknown_in_one_line(tmp_path, monkeypatch, capsys):
    _fake_sacctmgr(tmp_path, monkeypatch)
    monkeypatch.setenv("ANSWER", SANDBOX)
    _fake_client(tmp_path, monkeypatch, "squeue", "echo 'squeue: error: Invalid user: nobody' >&2; exit 1")
    limits.refuse_past_limit([1, 4])  # past the limit of 3, but nothing to count against: sbatch decides
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Invalid user" in err and "not checked" in err, err


def test_hpc_submit_limits_off_skips_the_check(tmp_path, monkeypatch):
    sacctmgr = _fake_sacctmgr(tmp_path, monkeypatch)
    monkeypatch.setenv("ANSWER", SANDBOX)
    squeue = _fake_client(tmp_path, monkeypatch, "squeue", "seq 3")
    monkeypatch.setenv("HPC_SUBMIT_LIMITS", "off")
    limits.refuse_past_limit([1, 4])
    assert _calls(sacctmgr) == [] and _calls(squeue) == []
    monkeypatch.setenv("HPC_SUBMIT_LIMITS", "on")
    with pytest.raises(limits.LimitError):
        limits.refuse_past_limit([1, 4])


def test_the_kept_answer_is_the_users_and_the_clusters(tmp_path, monkeypatch):
    """Two users of one home (the cache), or one user on two clusters whose slurm.conf differ, each
    get their own answer: the limit is the user's association, and each cluster has its own slurmdbd."""
    calls = _fake_sacctmgr(tmp_path, monkeypatch, 'case "$(cat)" in *name=root*) printf "%s" "$ANSWER" ;; esac')
    monkeypatch.setenv("ANSWER", SANDBOX)
    monkeypatch.setattr(filestamp, "RACY_NS", 0)  # a file written just now vouches for its content
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=a\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.setattr(os, "getuid", lambda: 0)
    assert [limit.jobs for limit in limits.submit_limits()] == [3]
    monkeypatch.setattr(os, "getuid", lambda: 1)  # another user: no association of root's
    assert limits.submit_limits() == []
    assert len(_calls(calls)) == 2
    monkeypatch.setattr(os, "getuid", lambda: 0)
    assert [limit.jobs for limit in limits.submit_limits()] == [3]
    assert len(_calls(calls)) == 2  # root's answer, kept
    conf.unlink()
    conf.write_text("ClusterName=other\n")  # the same path on another cluster's login node
    monkeypatch.setenv("ANSWER", SANDBOX.replace("normal|3", "normal|7"))
    assert [limit.jobs for limit in limits.submit_limits()] == [7]
    assert len(_calls(calls)) == 3


def test_cluster_with_limits_enforces_them_in_slurm_conf():
    c = L.ClusterLayout.create("/tmp/cluster-a", limits=True, max_submit_jobs=3)
    assert "AccountingStorageEnforce=associations,limits,qos\n" in files.render_slurm_conf(c)
    assert "AccountingStorageEnforce" not in files.render_slurm_conf(L.ClusterLayout.create("/tmp/cluster-a"))
    with pytest.raises(ValueError, match="HINT"):
        L.ClusterLayout.create("/tmp/cluster-a", limits=True, accounting=False)
    with pytest.raises(ValueError, match="HINT"):
        L.ClusterLayout.create("/tmp/cluster-a", max_submit_jobs=3)
