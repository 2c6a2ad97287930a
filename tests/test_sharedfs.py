"""Shared filesystems, injected: this machine's kernel has neither an NFS client nor nfsd, so each
behaviour of NFS or Lustre is put in by hand: a /proc/mounts naming the test directory nfs4 or
lustre, a directory fsync that answers EINVAL, a flock that answers ENOLCK, and a client that
remembers a failed lookup as NFS's negative dentry cache does.

    python -m pytest tests/test_sharedfs.py -q
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, strategies as st

from faults.sharedfs import NegativeCache, write_mounts
from hpc.fs import atomic, sharedfs
from hpc.checkpoint import CheckpointStore, reports
from hpc.checkpoint.files import load_file, write_atomic
from hpc.checkpoint.writer_lock import WriterLock
from hpc.rundir.run import RunDir, RunDirError

ROOT = Path(__file__).resolve().parents[1]


def fake_mounts(monkeypatch, tmp_path: Path, fstype: str, options: str = "rw,relatime") -> Path:
    mounts = write_mounts(tmp_path, fstype, options)
    monkeypatch.setattr(sharedfs, "MOUNTS", str(mounts))
    return mounts


def _escape(path: str) -> str:
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in path)


@given(st.lists(st.text(st.sampled_from("ab /\t\\\n"), min_size=1, max_size=12), min_size=1, max_size=5))
def test_mount_points_come_back_from_the_kernel_escapes(names):
    points = ["/" + n for n in names]
    text = "".join(f"dev {_escape(p)} nfs4 rw,vers=4.2 0 0\n" for p in points)
    assert [m.point for m in sharedfs.parse_mounts(text)] == points


def test_the_longest_and_latest_mount_holding_a_path_decides():
    mounts = sharedfs.parse_mounts("/dev/a / ext4 rw 0 0\nsrv:/x /mnt/nfs nfs rw 0 0\n"
                                   "srv:/y /mnt/nfs2 lustre rw,localflock 0 0\nsrv:/z /mnt/nfs tmpfs rw 0 0\n")
    assert sharedfs.mount_of("/mnt/nfs2/run", mounts).fstype == "lustre"  # not under /mnt/nfs
    assert sharedfs.mount_of("/mnt/nfs/run", mounts).fstype == "tmpfs"  # mounted over the nfs one
    assert sharedfs.mount_of("/home/u", mounts).fstype == "ext4"
    assert sharedfs.network("/mnt/nfs2/x", mounts) and not sharedfs.network("/mnt/nfs/x", mounts)
    assert "localflock" in sharedfs.local_locks("/mnt/nfs2/x", mounts)
    assert sharedfs.local_locks("/mnt/nfs/x", mounts) is None


@pytest.mark.parametrize("fstype, mapped", [("nfs4", False), ("lustre", False), ("ext4", True)])
def test_checkpoints_are_memory_mapped_only_on_a_local_disk(monkeypatch, tmp_path, fstype, mapped):
    monkeypatch.delenv("HPC_MMAP", raising=False)
    fake_mounts(monkeypatch, tmp_path, fstype)
    path = tmp_path / "shared.pt"
    write_atomic(path, {"w": torch.arange(1000.0)})
    loaded = load_file(path)
    assert (str(path) in Path("/proc/self/maps").read_text()) == mapped
    del loaded
    monkeypatch.setenv("HPC_MMAP", "1")  # the override wins over the detection
    loaded = load_file(path)
    assert str(path) in Path("/proc/self/maps").read_text()


PRUNED = """
import sys, torch
from hpc.fs import sharedfs
from hpc.checkpoint.files import load_file
sharedfs.MOUNTS = sys.argv[2]
w = load_file(sys.argv[1])["w"]
open(sys.argv[1], "w").close()  # what a prune by another node does to the mapping: the pages are gone
print(float(w.sum()))
"""


@pytest.mark.parametrize("fstype", ["nfs", "ext4"])
def test_a_checkpoint_pruned_after_its_load_is_still_readable_on_nfs(monkeypatch, tmp_path, fstype):
    """On NFS the pruned file is gone from the server; a mapped page read afterwards is SIGBUS.
    Truncating the file does the same to a mapping on any filesystem: on the ext4 mount the
    process dies of SIGBUS, on the nfs one the tensor was read into memory and stays readable."""
    mounts = fake_mounts(monkeypatch, tmp_path, fstype)
    write_atomic(tmp_path / "shared.pt", {"w": torch.ones(1 << 16)})
    run = subprocess.run([sys.executable, "-c", PRUNED, str(tmp_path / "shared.pt"), str(mounts)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HPC_MMAP": ""})
    if fstype == "nfs":
        assert run.returncode == 0 and float(run.stdout) == 1 << 16, run.stderr
    else:
        assert run.returncode == -7, (run.returncode, run.stderr)  # SIGBUS


def einval_for_directories(monkeypatch) -> list:
    """os.fsync answering EINVAL for directories, as some NFS and FUSE mounts do."""
    real, calls = os.fsync, []

    def fsync(fd):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            calls.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


def test_a_directory_fsync_answering_einval_does_not_fail_a_commit(monkeypatch, tmp_path, caplog):
    calls = einval_for_directories(monkeypatch)
    monkeypatch.setattr(sharedfs, "_said", set())
    with caplog.at_level(logging.WARNING, logger="hpc.fs.sharedfs"):
        store = CheckpointStore(tmp_path / "ckpt", keep=2)
        for step in (1, 2, 3):
            store.save(step, {"w": torch.full((4,), float(step))}, blocking=True)
        store.close()
        atomic.write_bytes(tmp_path / "manifest.json", b"{}")
    assert calls and CheckpointStore(tmp_path / "ckpt").load()["w"][0] == 3
    said = [r.message for r in caplog.records if "fsync of a directory" in r.message]
    assert len(said) == 1 and "Invalid argument" in said[0]  # once, however many commits


def test_other_directory_fsync_errors_still_fail(monkeypatch, tmp_path):
    def fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output"):
        sharedfs.fsync_dir(tmp_path)


def no_locks(monkeypatch):
    def flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", flock)


def test_a_run_dir_without_locks_is_refused_with_the_reason(monkeypatch, tmp_path):
    fake_mounts(monkeypatch, tmp_path, "nfs", "rw,vers=3")
    no_locks(monkeypatch)
    with pytest.raises(RunDirError) as refused:
        with RunDir(tmp_path / "run").submission_lock():
            pass
    message = str(refused.value)
    assert "No locks available" in message and "ENOLCK" in message and "nfs mounted at" in message
    assert "HINT:" in message and "space" not in message and "\n" not in message


def test_the_submission_command_names_the_missing_locks_not_free_space(monkeypatch, tmp_path, capsys):
    from hpc import submit

    no_locks(monkeypatch)
    assert submit.main(["run", "--cluster", "local", "--run-dir", str(tmp_path / "run"), "--",
                        "true"]) == 2
    err = capsys.readouterr().err
    assert "No locks available" in err and "free space" not in err


def test_node_local_locks_are_warned_about(monkeypatch, tmp_path):
    fake_mounts(monkeypatch, tmp_path, "lustre", "rw,localflock")
    said = []
    with RunDir(tmp_path / "run").submission_lock(say=said.append):
        pass
    assert len(said) == 1 and "localflock" in said[0] and "HINT:" in said[0]
    with pytest.warns(RuntimeWarning, match="localflock"):
        lock = WriterLock(tmp_path, "job.0")
        lock.acquire()
    lock.release()


def test_rank_0_sees_a_peer_file_that_appeared_after_its_first_look(monkeypatch, tmp_path):
    """Rank 0 commits once rank 1's done file exists. It looks before rank 1 has written it; on NFS
    a lookup of that name would keep failing from the cache long after (here: for good)."""
    tmp = tmp_path / ".step-1.tmp"
    tmp.mkdir()
    result = {}
    with NegativeCache() as cache:
        looker = threading.Thread(target=lambda: result.update(files=reports.collect(tmp, 2, "g", 20.0)))
        looker.start()
        time.sleep(0.3)  # rank 0 has looked at least once
        (tmp / "rank-1.done").write_bytes(json.dumps({"generation": "g", "list": {"bytes": 2}}).encode())
        looker.join(timeout=30)
    assert result.get("files") == {"files-1.json": {"bytes": 2}}, cache.misses
