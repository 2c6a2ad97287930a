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
    step-120/COMPLETE.json    marker: step, files and their sha256; written last

Files are written into ``.step-N.tmp/`` (temporary name, fsync, rename), then rank 0 writes the
marker and renames the directory. A directory counts only with a marker whose checksums match, so a
process killed mid-write leaves the previous checkpoint as the newest valid one. Loading uses
``torch.load(weights_only=True)``: a checkpoint can never run pickled code.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle
import re
import shutil
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

MARKER = "COMPLETE.json"
SHARED = "shared.pt"
PER_RANK_KEY = "per_rank"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_TMP_DIR = re.compile(r"^\.step-(\d+)\.tmp$")
# How long rank 0 waits for the other ranks' files before giving up on a checkpoint.
RANK_WAIT_S = 600.0


def snapshot(obj: Any) -> Any:
    """Deep copy of `obj` with every tensor detached and copied to CPU (the in-memory copy)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return type(obj)((k, snapshot(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(snapshot(v) for v in obj)
    return obj


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> str:
    """Write `data` to `path` via a temporary name + fsync + rename; return its sha256."""
    part = path.with_name(path.name + ".part")
    with open(part, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, path)
    return hashlib.sha256(data).hexdigest()


def _serialise(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _generation() -> str:
    """Identifies this attempt of the job, identical on every rank without communication.

    Stale rank files left in a temporary directory by a killed earlier attempt carry another
    generation, so rank 0 never commits them.
    """
    env = os.environ
    job = env.get("SLURM_JOB_ID") or env.get("TORCHELASTIC_RUN_ID") or f"pid{os.getppid()}"
    return f"{job}.{env.get('SLURM_RESTART_COUNT', '0')}"


class CheckpointStore:
    """Keeps the latest `keep` checkpoints of one run in `directory` (see module docstring)."""

    def __init__(self, directory: str | os.PathLike, keep: int = 3, rank: int = 0,
                 world_size: int = 1) -> None:
        if keep < 1:
            raise ValueError(f"keep={keep}; expected at least 1. HINT: keep=1 keeps only the newest.")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} with world_size={world_size}; expected 0 <= rank < world_size.")
        self.directory = Path(directory)
        self.keep, self.rank, self.world_size = keep, rank, world_size
        self.directory.mkdir(parents=True, exist_ok=True)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.stats = {"saves": 0, "copy_s": 0.0, "waited_s": 0.0, "write_s": 0.0}

    # ---------------------------------------------------------------- saving
    def save(self, step: int, state: dict[str, Any], blocking: bool = False) -> None:
        """Checkpoint `state` as step `step`; every rank calls this with the same step.

        The caller pays for the in-memory copy only. A save that is due while the previous write
        still runs waits for it first: never two writes at once, and every rank saves the same
        steps (skipping would let ranks disagree about which checkpoints exist).
        """
        t0 = time.perf_counter()
        self.wait()
        t1 = time.perf_counter()
        own = {k: v for k, v in state.items() if k != PER_RANK_KEY} if self.rank == 0 else None
        copy = (snapshot(own), snapshot(state.get(PER_RANK_KEY)))
        t2 = time.perf_counter()
        self.stats["saves"] += 1
        self.stats["waited_s"] += t1 - t0
        self.stats["copy_s"] += t2 - t1
        args = (int(step), copy[0], copy[1], _generation())
        if blocking:
            self._write(*args)
            return
        self._thread = threading.Thread(target=self._write_guarded, args=args,
                                        name=f"checkpoint-step-{step}", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Block until the background write finishes; re-raise its error here, in the caller."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"background checkpoint write in {self.directory} failed") from err

    def close(self) -> None:
        self.wait()

    def _write_guarded(self, *args: Any) -> None:
        try:
            self._write(*args)
        except BaseException as err:  # surfaced by wait() in the training thread
            self._error = err

    def _write(self, step: int, shared: Any, per_rank: Any, generation: str) -> None:
        t0 = time.perf_counter()
        tmp = self.directory / f".step-{step}.tmp"
        tmp.mkdir(exist_ok=True)
        if per_rank is not None:
            digest = _write_atomic(tmp / f"rank-{self.rank}.pt", _serialise(per_rank))
            _write_atomic(tmp / f"rank-{self.rank}.done", json.dumps(
                {"generation": generation, "sha256": digest}).encode())
        if self.rank == 0:
            files = {SHARED: _write_atomic(tmp / SHARED, _serialise(shared))}
            if per_rank is not None:
                files.update(self._collect_ranks(tmp, generation))
            self._commit(step, tmp, files)
        self.stats["write_s"] += time.perf_counter() - t0

    def _collect_ranks(self, tmp: Path, generation: str) -> dict[str, str]:
        """Wait for every rank's file of this generation; return name -> sha256."""
        files, deadline = {}, time.monotonic() + RANK_WAIT_S
        for r in range(self.world_size):
            done = tmp / f"rank-{r}.done"
            while True:
                info = json.loads(done.read_text()) if done.exists() else {}
                if info.get("generation") == generation:
                    files[f"rank-{r}.pt"] = info["sha256"]
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"rank {r} did not write {done} within {RANK_WAIT_S:.0f}s; checkpoint "
                        f"left incomplete. HINT: every rank must call save() with the same step.")
                time.sleep(0.05)
        return files

    def _commit(self, step: int, tmp: Path, files: dict[str, str]) -> None:
        marker = {"step": step, "world_size": self.world_size, "files": files, "time": time.time()}
        _write_atomic(tmp / MARKER, json.dumps(marker, indent=1).encode())
        final = self.directory / f"step-{step}"
        if final.exists():  # the same step saved again after resuming from an older one
            old = self.directory / f".step-{step}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(self.directory)
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
        """Newest step whose checkpoint is complete and passes its checksums."""
        for step in reversed(self.steps()):
            if self._read(step, "cpu", warn=False) is not None:
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
        problem, blobs = self._verify(path)
        if problem:
            if warn:
                _warn(f"skipping checkpoint {path}: {problem}")
            return None
        state = _load_safe(path / SHARED, blobs[SHARED], map_location)
        own = f"rank-{self.rank}.pt"
        state[PER_RANK_KEY] = _load_safe(path / own, blobs[own], map_location) if own in blobs else None
        return state

    def _verify(self, path: Path) -> tuple[str, dict[str, bytes]]:
        """('', file bytes) when `path` is complete and intact, else (what is wrong, {})."""
        try:
            marker = json.loads((path / MARKER).read_text())
        except FileNotFoundError:
            return "no completion marker", {}
        except ValueError as err:
            return f"unreadable completion marker ({err})", {}
        wanted = {SHARED, f"rank-{self.rank}.pt"}
        blobs = {}
        for name, digest in marker.get("files", {}).items():
            try:
                data = (path / name).read_bytes()
            except FileNotFoundError:
                return f"{name} is missing", {}
            if hashlib.sha256(data).hexdigest() != digest:
                return f"{name} does not match its sha256 checksum (corrupted)", {}
            if name in wanted:
                blobs[name] = data
        if SHARED not in blobs:
            return f"marker lists no {SHARED}", {}
        return "", blobs


def _load_safe(path: Path, data: bytes, map_location: Any) -> Any:
    try:
        return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(
            f"{path} holds objects that weights_only loading refuses ({err}). Loading never runs "
            "pickled code. HINT: save only tensors, numbers, strings and containers of them, e.g. "
            "model.state_dict() instead of the model.") from None


def _warn(message: str) -> None:
    log.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
