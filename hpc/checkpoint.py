"""Atomic, discoverable checkpoints: ``step-N/`` directories written in the background.

Usage::

    store = CheckpointStore("run/stage/checkpoints", keep=3, rank=s.rank, world_size=s.world_size)
    state = store.load()                     # newest valid checkpoint, or None on a first run
    store.save(step, {"model": m.state_dict(), "per_rank": {"rng": rng.capture()}})
    store.save(last, state, blocking=True)   # the final save waits for the disk
    store.close()

Layout of one checkpoint (every rank calls ``save``; rank 0 commits)::

    step-120/shared.pt        state minus "per_rank", written by rank 0
    step-120/rank-R.pt        state["per_rank"] of rank R (RNG, sampler position, ...)
    step-120/COMPLETE.json    marker: step, files with their crc32 and size; written last

Files are written into ``.step-N.tmp/`` (temporary name, fsync, rename), then rank 0 writes the
marker and renames the directory. A directory counts only with a marker whose checksums match, so a
process killed mid-write leaves the previous checkpoint as the newest valid one. Loading uses
``torch.load(weights_only=True)``: a checkpoint can never run pickled code.

Costs (hpc.checkpoint_io, hpc.background): a background save forks a copy-on-write writer
(``mode="fork"``) after copying accelerator tensors to reused CPU buffers; ``mode="thread"``
copies every tensor into reused buffers and writes from a thread; ``mode="auto"`` (default, or
HPC_CHECKPOINT_MODE) forks for states of 32 MiB and more, where the fork is the cheaper of the
two. A blocking save (the final one, the one on a stop signal) streams the live state to disk in
one pass, without any copy, its checksum computed on a second thread alongside the write.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from hpc import background
from hpc.checkpoint_io import (Staging, fsync_dir, load_file, verify, write_atomic,
                               write_bytes_atomic)

log = logging.getLogger(__name__)

MARKER = "COMPLETE.json"
SHARED = "shared.pt"
PER_RANK_KEY = "per_rank"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_TMP_DIR = re.compile(r"^\.step-(\d+)\.tmp$")
# How long rank 0 waits for the other ranks' files before giving up on a checkpoint.
RANK_WAIT_S = 600.0
# mode="auto": CPU state of at least this size is written by a forked writer, smaller by a thread.
AUTO_FORK_BYTES = 32 * 2**20


def _cpu_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size() if obj.device.type == "cpu" else 0
    if isinstance(obj, dict):
        return sum(_cpu_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_cpu_bytes(v) for v in obj)
    return 0


def _generation() -> str:
    """Identifies this attempt of the job, identical on every rank without communication.

    Stale rank files left in a temporary directory by a killed earlier attempt carry another
    generation, so rank 0 never commits them. Computed in the training process, never in a
    forked writer (whose parent pid is the training process).
    """
    env = os.environ
    job = env.get("SLURM_JOB_ID") or env.get("TORCHELASTIC_RUN_ID") or f"pid{os.getppid()}"
    return f"{job}.{env.get('SLURM_RESTART_COUNT', '0')}"


class CheckpointStore:
    """Keeps the latest `keep` checkpoints of one run in `directory` (see module docstring)."""

    def __init__(self, directory: str | os.PathLike, keep: int = 3, rank: int = 0,
                 world_size: int = 1, mode: str | None = None) -> None:
        if keep < 1:
            raise ValueError(f"keep={keep}; expected at least 1. HINT: keep=1 keeps only the newest.")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} with world_size={world_size}; expected 0 <= rank < world_size.")
        self.mode = mode or os.environ.get("HPC_CHECKPOINT_MODE") or "auto"
        if self.mode not in background.MODES + ("auto",):
            raise ValueError(f"checkpoint mode {self.mode!r}; expected auto, fork or thread. "
                             "HINT: mode='thread' (or HPC_CHECKPOINT_MODE=thread) where fork fails.")
        self.directory = Path(directory)
        self.keep, self.rank, self.world_size = keep, rank, world_size
        self.directory.mkdir(parents=True, exist_ok=True)
        self._job: Any = None
        self._staging = Staging()
        self._writer = background.ThreadWriter()
        self.stats = {"saves": 0, "copy_s": 0.0, "waited_s": 0.0, "write_s": 0.0}

    # ---------------------------------------------------------------- saving
    def save(self, step: int, state: dict[str, Any], blocking: bool = False) -> None:
        """Checkpoint `state` as step `step`; every rank calls this with the same step.

        Background (default): the caller pays for copying accelerator tensors to CPU and a fork
        (thread mode: copying every tensor). A save that is due while the previous write still
        runs waits for it first: never two writes at once, and every rank saves the same steps
        (skipping would let ranks disagree about which checkpoints exist). Blocking: written
        straight from the live state, one pass, no copy; returns when committed (rank 0).
        """
        t0 = time.perf_counter()
        self.wait()  # a stop's blocking save lets the running write finish: it may be the newest
        t1 = time.perf_counter()
        own = {k: v for k, v in state.items() if k != PER_RANK_KEY} if self.rank == 0 else None
        args = [int(step), own, state.get(PER_RANK_KEY), _generation()]
        self.stats["saves"] += 1
        self.stats["waited_s"] += t1 - t0
        if blocking:
            self._write(*args, overlap=True)
            self.stats["write_s"] += time.perf_counter() - t1
            return
        mode = self._mode_for(args[1:3])
        # Fork: CPU tensors reach the child copy-on-write, only device tensors need a copy first.
        # The thread writer reads pinned buffers (full-speed device copies); a forked writer must
        # get pageable ones (see Staging).
        args[1:3] = self._staging.stage(tuple(args[1:3]), cpu_too=mode == "thread", pin=mode == "thread")
        self._job = background.start(self._write, tuple(args), mode, self._writer)
        self.stats["copy_s"] += time.perf_counter() - t1

    def _mode_for(self, state: Any) -> str:
        """'auto': fork for large states; a thread with a buffer copy below AUTO_FORK_BYTES, where
        copying (~0.2 ms/MB into reused buffers) is cheaper than a fork (~3-7 ms with torch loaded)."""
        if self.mode != "auto":
            return self.mode
        if background.default_mode() == "thread" or _cpu_bytes(state) < AUTO_FORK_BYTES:
            return "thread"
        return "fork"

    def wait(self) -> None:
        """Block until the background write finishes; re-raise its error here, in the caller."""
        job, self._job = self._job, None
        if job is None:
            return
        try:
            self.stats["write_s"] += job.wait()
        except BaseException as err:
            raise RuntimeError(f"background checkpoint write in {self.directory} failed") from err

    def close(self) -> None:
        self.wait()
        self._writer.close()

    def _write(self, step: int, shared: Any, per_rank: Any, generation: str,
               overlap: bool = False) -> None:
        tmp = self.directory / f".step-{step}.tmp"
        tmp.mkdir(exist_ok=True)
        if per_rank is not None:
            info = write_atomic(tmp / f"rank-{self.rank}.pt", per_rank, overlap)
            write_bytes_atomic(tmp / f"rank-{self.rank}.done", json.dumps(
                {"generation": generation, "file": info}).encode())
        if self.rank == 0:
            files = {SHARED: write_atomic(tmp / SHARED, shared, overlap)}
            if per_rank is not None:
                files.update(self._collect_ranks(tmp, generation))
            self._commit(step, tmp, files)

    def _collect_ranks(self, tmp: Path, generation: str) -> dict[str, str]:
        """Wait for every rank's file of this generation; return name -> checksum info."""
        files, deadline = {}, time.monotonic() + RANK_WAIT_S
        for r in range(self.world_size):
            done = tmp / f"rank-{r}.done"
            while True:
                info = json.loads(done.read_text()) if done.exists() else {}
                if info.get("generation") == generation:
                    files[f"rank-{r}.pt"] = info["file"]
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"rank {r} did not write {done} within {RANK_WAIT_S:.0f}s; checkpoint "
                        f"left incomplete. HINT: every rank must call save() with the same step.")
                time.sleep(0.05)
        return files

    def _commit(self, step: int, tmp: Path, files: dict[str, str]) -> None:
        marker = {"step": step, "world_size": self.world_size, "files": files, "time": time.time()}
        write_bytes_atomic(tmp / MARKER, json.dumps(marker, indent=1).encode())
        final = self.directory / f"step-{step}"
        if final.exists():  # the same step saved again after resuming from an older one
            old = self.directory / f".step-{step}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fsync_dir(self.directory)
        self._prune()

    def _prune(self) -> None:
        steps = self.steps()
        for step in steps[:-self.keep]:
            shutil.rmtree(self.directory / f"step-{step}", ignore_errors=True)
        # Temporary dirs older than the newest commit are leftovers of killed writes: every rank
        # has finished them (rank 0 commits only after all ranks wrote), so they are safe to drop.
        for step, tmp in self._tmp_dirs():
            if steps and step < steps[-1]:
                shutil.rmtree(tmp, ignore_errors=True)

    def _tmp_dirs(self) -> list[tuple[int, Path]]:
        found = ((_TMP_DIR.match(p.name), p) for p in self.directory.iterdir())
        return [(int(m.group(1)), p) for m, p in found if m]

    # --------------------------------------------------------------- loading
    def steps(self) -> list[int]:
        """Steps of committed directories (marker present or not), oldest first."""
        found = (_STEP_DIR.match(p.name) for p in self.directory.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def latest(self) -> int | None:
        """Newest step whose checkpoint is complete and passes its checksums (nothing loaded)."""
        for step in reversed(self.steps()):
            if not self._verify(self.directory / f"step-{step}")[0]:
                return step
        return None

    def load(self, step: int | None = None, map_location: Any = "cpu") -> dict[str, Any] | None:
        """State of `step`, or of the newest valid checkpoint; None when there is none.

        Incomplete or corrupted checkpoints are skipped with a warning that names them. The
        returned dict holds this rank's own ``per_rank`` entry (None if it saved none).
        """
        candidates = [step] if step is not None else list(reversed(self.steps()))
        self._warn_incomplete(candidates[0] if candidates else None)
        for s in candidates:
            state = self._read(s, map_location, warn=True)
            if state is not None:
                return state
        return None

    def _warn_incomplete(self, newest: int | None) -> None:
        for n, p in self._tmp_dirs():
            if newest is None or n > newest:
                _warn(f"skipping incomplete checkpoint {p} (no completion marker; the write was "
                      "interrupted)")

    def _read(self, step: int, map_location: Any, warn: bool) -> dict[str, Any] | None:
        path = self.directory / f"step-{step}"
        problem, names = self._verify(path)
        if problem:
            if warn:
                _warn(f"skipping checkpoint {path}: {problem}")
            return None
        state = load_file(path / SHARED, map_location)
        own = f"rank-{self.rank}.pt"
        state[PER_RANK_KEY] = load_file(path / own, map_location) if own in names else None
        return state

    def _verify(self, path: Path) -> tuple[str, set[str]]:
        """('', names of the files) when `path` is complete and intact, else (what is wrong, {}).

        Every rank checks every file, not only its own: a corrupt file of one rank must make all
        ranks skip the checkpoint alike, or they would resume from different steps.
        """
        try:
            marker = json.loads((path / MARKER).read_text())
        except FileNotFoundError:
            return "no completion marker", set()
        except ValueError as err:
            return f"unreadable completion marker ({err})", set()
        files = marker.get("files", {})
        if SHARED not in files:  # checked first: no file is read for a marker that cannot load
            return f"marker lists no {SHARED}", set()
        for name, expected in files.items():
            problem = verify(path / name, expected)
            if problem:
                return problem, set()
        return "", set(files)


def _warn(message: str) -> None:
    log.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
