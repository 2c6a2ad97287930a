"""Shared filesystems, injected: what NFS and Lustre do that a local disk does not, put in by hand.

    python -c "from faults.sharedfs import negative_cache as f; print(f(__import__('pathlib').Path('/tmp/x'), 3, 0))"

The machine the campaigns run on has no NFS client or server in its kernel, so each behaviour is
injected (hpc.fs.sharedfs says what hpc does about it):
  - dir_fsync_einval: every directory fsync answers EINVAL; checkpoints are saved and loaded back.
  - negative_cache: lookups of a missing name keep failing until the directory is read again, as
    NFS's negative dentries do; rank 0 of a 2-rank store commits while rank 1's file comes late.
  - pruned_after_load: a checkpoint on a mount /proc/mounts calls nfs is loaded, then its file is
    truncated, which is what a prune by another node does to a mapping; the tensors are then read.
  - no_locks: flock answers ENOLCK; a submission must be refused with the reason and a HINT.
Lost: a save that failed or a load that did not return the step saved; a commit that did not
complete; a process killed by SIGBUS or a wrong sum; any other answer to a missing lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import multiprocessing
import os
import threading
import time
from pathlib import Path
from typing import Iterator
from unittest import mock

import torch

from faults.common import Outcome
from hpc.fs import sharedfs
from hpc.checkpoint import CheckpointStore
from hpc.checkpoint import store as store_module
from hpc.checkpoint.files import load_file, write_atomic
from hpc.rundir.run import RunDir, RunDirError

_FORK = multiprocessing.get_context("fork")


def write_mounts(directory: Path, fstype: str, options: str = "rw,relatime") -> Path:
    """A /proc/mounts file in which `directory` is a mount of `fstype`, below a local root."""
    mounts = Path(directory).parent / f"mounts-{Path(directory).name}"
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\nserver:/export {directory} {fstype} {options} 0 0\n")
    return mounts


@contextlib.contextmanager
def mounted_as(directory: Path, fstype: str) -> Iterator[Path]:
    """hpc.fs.sharedfs sees `directory` as a mount of `fstype` inside the block."""
    with mock.patch.object(sharedfs, "MOUNTS", str(write_mounts(directory, fstype))) as mounts:
        yield mounts


class NegativeCache:
    """A client that remembers a failed lookup, as NFS keeps a negative dentry, until the directory
    is read again (a changed directory drops its cached misses). Lookups through Path.read_text and
    os.stat are cached; os.listdir always asks the server. A context manager: patches, then restores."""

    def __init__(self) -> None:
        self.misses: set[str] = set()
        self._patches = []

    def __enter__(self) -> "NegativeCache":
        real_read, real_stat, real_listdir = Path.read_text, os.stat, os.listdir

        def read_text(path, *a, **kw):
            self._lookup(str(path), real_stat)
            return real_read(path, *a, **kw)

        def stat(path, *a, **kw):
            self._lookup(os.fspath(path), real_stat)
            return real_stat(path, *a, **kw)

        def listdir(path="."):
            names = real_listdir(path)
            self.misses = {m for m in self.misses if os.path.dirname(m) != os.fspath(path).rstrip("/")}
            return names

        self._patches = [mock.patch.object(Path, "read_text", read_text), mock.patch.object(os, "stat", stat),
                         mock.patch.object(os, "listdir", listdir)]
        for p in self._patches:
            p.start()
        return self

    def __exit__(self, *exc) -> None:
        for p in self._patches:
            p.stop()

    def _lookup(self, path: str, real_stat) -> None:
        if path in self.misses:
            raise FileNotFoundError(errno.ENOENT, "cached miss", path)
        try:
            real_stat(path)
        except FileNotFoundError:
            self.misses.add(path)
            raise


def dir_fsync_einval(scratch: Path, saves: int, seed: int) -> Outcome:
    real = os.fsync

    def fsync(fd):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd)

    outcome = Outcome(0, 0, "every directory fsync answers EINVAL; keep=2, background and blocking saves")
    with mock.patch.object(os, "fsync", fsync):
        store = CheckpointStore(Path(scratch) / "ckpt", keep=2)
        for step in range(1, saves + 1):
            try:
                store.save(step, {"w": torch.full((64,), float(step))}, blocking=step % 2 == 0)
                store.wait()
                state = CheckpointStore(Path(scratch) / "ckpt").load()
                outcome.add("" if state and float(state["w"][0]) == step else f"step {step} did not load back")
            except Exception as err:
                outcome.add(f"step {step}: {type(err).__name__}: {err}")
        store.close()
    return outcome


def negative_cache(scratch: Path, commits: int, seed: int) -> Outcome:
    outcome = Outcome(0, 0, "rank 1's file written after rank 0's first look; misses cached until "
                            "the directory is read")
    directory = Path(scratch) / "ckpt"
    with mock.patch.object(store_module, "RANK_WAIT_S", 20.0), NegativeCache():
        ranks = [CheckpointStore(directory, keep=2, rank=r, world_size=2) for r in (0, 1)]
        for step in range(1, commits + 1):
            state = {"w": torch.full((8,), float(step)), "per_rank": {"r": step}}
            errors = []

            def save(r: int) -> None:
                try:
                    ranks[r].save(step, state, blocking=True)
                except Exception as err:
                    errors.append(f"rank {r}: {type(err).__name__}: {err}")

            first = threading.Thread(target=save, args=(0,))
            first.start()
            time.sleep(0.2)  # rank 0 looks for rank 1's file before it exists
            save(1)
            first.join()
            loaded = CheckpointStore(directory).load()
            outcome.add("; ".join(errors) or ("" if loaded and float(loaded["w"][0]) == step
                                              else f"step {step} not committed"))
        for store in ranks:
            store.close()
    return outcome


def _read_pruned(path: str) -> None:
    w = load_file(Path(path))["w"]
    open(path, "w").close()  # truncated: the pages a mapping had are gone
    os._exit(0 if float(w.numpy().sum()) == w.numel() else 3)  # numpy: torch's thread pool hangs after fork


def pruned_after_load(scratch: Path, rounds: int, seed: int) -> Outcome:
    outcome = Outcome(0, 0, "checkpoint on a mount /proc/mounts calls nfs, truncated after the load, "
                            "then read; a forked child per round")
    directory = Path(scratch) / "nfs"
    directory.mkdir(parents=True, exist_ok=True)
    with mounted_as(directory, "nfs"), mock.patch.dict(os.environ, {"HPC_MMAP": ""}):
        for i in range(rounds):
            path = directory / f"shared-{i}.pt"
            write_atomic(path, {"w": torch.ones(1 << 16)})
            child = _FORK.Process(target=_read_pruned, args=(str(path),))
            child.start()
            child.join(60)
            code = child.exitcode
            outcome.add("" if code == 0 else "killed by SIGBUS" if code == -7 else f"exit code {code}")
    return outcome


def no_locks(scratch: Path, attempts: int, seed: int) -> Outcome:
    def flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    outcome = Outcome(0, 0, "flock answers ENOLCK; a submission lock must be refused with the reason")
    with mock.patch.object(fcntl, "flock", flock):
        for i in range(attempts):
            try:
                with RunDir(Path(scratch) / f"run-{i}").submission_lock():
                    outcome.add("the submission went on without a lock")
                    continue
            except RunDirError as err:
                text = str(err)
                good = "No locks available" in text and "HINT:" in text and "space" not in text
                outcome.add("" if good else f"refused as: {text}")
            except Exception as err:
                outcome.add(f"{type(err).__name__}: {err}")
    return outcome


if __name__ == "__main__":
    import sys

    kind, scratch, count = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    print(json.dumps(vars(globals()[kind](scratch, count, 0))))
