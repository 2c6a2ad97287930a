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
    step-120/__R_0.distcp     with save(..., sharded=): model and optimizer shards (hpc.dcp)
    step-120/.metadata        DCP's index of those shards, written after every rank's data

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
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from hpc import background
from hpc import checkpoint_layout as layout
from hpc.checkpoint_io import (Staging, file_info, fsync_dir, load_file, nbytes, space_error,
                               write_atomic, write_bytes_atomic)
from hpc.checkpoint_layout import DCP_METADATA, MARKER, SHARED
from hpc.checkpoint_lock import StoreLocked, WriterLock, wait_for_owner

log = logging.getLogger(__name__)

__all__ = ["CheckpointStore", "StoreLocked", "MARKER", "SHARED", "PER_RANK_KEY", "SHARDED_KEY"]

PER_RANK_KEY = "per_rank"
# load() puts the directory of a checkpoint holding DCP shards under this key (hpc.dcp loads them)
SHARDED_KEY = "sharded_dir"
# How long rank 0 waits for the other ranks' files before giving up on a checkpoint.
RANK_WAIT_S = 600.0
# A read whose checkpoint the writer replaced meanwhile starts over; this many times at most.
READ_ATTEMPTS = 100
_RACED = object()  # a read met a rename or deletion by the writer: scan again
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
        self._pending: int | None = None  # step of the background write in flight
        self._lock: WriterLock | None = None  # rank 0's, taken at the first save (readers never lock)
        self._claimed = False
        self._checked: dict[tuple, str] = {}  # (step, inode, marker mtime) -> problem ('' = valid)
        self._staging = Staging()
        self._writer = background.ThreadWriter()
        self.stats = {"saves": 0, "copy_s": 0.0, "waited_s": 0.0, "write_s": 0.0}

    # ---------------------------------------------------------------- saving
    def save(self, step: int, state: dict[str, Any], blocking: bool = False,
             sharded: Any = None) -> None:
        """Checkpoint `state` as step `step`; every rank calls this with the same step.

        `sharded(directory, blocking)` (optional, every rank) writes model and optimizer shards
        into the checkpoint's temporary directory through DCP and returns a function that waits
        for them. The writer waits for it before its own files: rank 0's marker, which lists
        and checksums the shards and DCP's .metadata, is written after DCP finished. Such a save
        runs on the writer thread (a forked writer cannot wait on DCP's thread).

        Background (default): the caller pays for copying accelerator tensors to CPU and a fork
        (thread mode: copying every tensor). A save that is due while the previous write still
        runs waits for it first: never two writes at once, and every rank saves the same steps
        (skipping would let ranks disagree about which checkpoints exist). Blocking: written
        straight from the live state, one pass, no copy; returns when committed (rank 0).
        """
        t0 = time.perf_counter()
        self.wait()  # a stop's blocking save lets the running write finish: it may be the newest
        self._claim()
        t1 = time.perf_counter()
        own = {k: v for k, v in state.items() if k != PER_RANK_KEY} if self.rank == 0 else None
        args = [int(step), own, state.get(PER_RANK_KEY), _generation()]
        shards = None if sharded is None else sharded(self.directory / layout.name("tmp", step), blocking)
        self.stats["saves"] += 1
        self.stats["waited_s"] += t1 - t0
        if blocking:
            self._write(*args, overlap=True, shards=shards)
            self.stats["write_s"] += time.perf_counter() - t1
            return
        mode = "thread" if shards is not None else self._mode_for(args[1:3])
        # Fork: CPU tensors reach the child copy-on-write, only device tensors need a copy first.
        # The thread writer reads pinned buffers (full-speed device copies); a forked writer must
        # get pageable ones (see Staging).
        args[1:3] = self._staging.stage(tuple(args[1:3]), cpu_too=mode == "thread", pin=mode == "thread")
        self._job = background.start(self._write, (*args, False, shards), mode, self._writer)
        self._pending = args[0]
        self.stats["copy_s"] += time.perf_counter() - t1

    def _mode_for(self, state: Any) -> str:
        """'auto': fork for large states; a thread with a buffer copy below AUTO_FORK_BYTES, where
        copying into reused buffers (cost grows with the bytes) is cheaper than a fork (a fixed cost
        for the page tables of a process with torch loaded); BENCHMARKS.md times both sides."""
        if self.mode != "auto":
            return self.mode
        if background.default_mode() == "thread" or _cpu_bytes(state) < AUTO_FORK_BYTES:
            return "thread"
        return "fork"

    def wait(self) -> None:
        """Block until the background write finishes; re-raise its error here, in the caller."""
        job, self._job = self._job, None
        step, self._pending = self._pending, None
        if job is None:
            return
        try:
            self.stats["write_s"] += job.wait()
        except BaseException as err:
            lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
            first = lines[0] if lines else type(err).__name__
            if first.endswith(":") and len(lines) > 1:  # a forked writer's report: "... failed:"
                first += f" {lines[-1]}"  # then its traceback, whose last line is the error itself
            raise RuntimeError(f"background checkpoint write in {self.directory} failed: {first}") from err
        if self.rank == 0 and step is not None:  # a forked writer's validity cache died with it
            self._problem(step, self.directory / layout.name("step", step), known="")

    def close(self) -> None:
        """Wait for the write in flight, stop the writer thread, release the store's lock."""
        try:
            self.wait()
        finally:
            self._writer.close()
            if self._lock is not None:
                self._lock.release()
                self._lock, self._claimed = None, False

    def _claim(self) -> None:
        """First save: rank 0 locks the store (StoreLocked if another job writes here) and finishes
        commits that a kill interrupted; ranks > 0 wait until their own rank 0 holds the lock."""
        if self._claimed:
            return
        generation = _generation()
        if self.rank == 0:
            lock = WriterLock(self.directory, generation)
            lock.acquire()
            self._lock = lock
            for message in self._recover():
                _warn(message)
        else:
            wait_for_owner(self.directory, generation)
        self._claimed = True

    def _write(self, step: int, shared: Any, per_rank: Any, generation: str,
               overlap: bool = False, shards: Any = None) -> None:
        tmp = self.directory / layout.name("tmp", step)
        try:
            tmp.mkdir(exist_ok=True)
            if shards is not None:
                shards()  # this rank's shards on disk; on rank 0 also DCP's metadata
            if per_rank is not None:
                info = write_atomic(tmp / f"rank-{self.rank}.pt", per_rank, overlap)
                write_bytes_atomic(tmp / f"rank-{self.rank}.done", json.dumps(
                    {"generation": generation, "file": info}).encode())
            if self.rank == 0:
                files = {SHARED: write_atomic(tmp / SHARED, shared, overlap)}
                if shards is not None:
                    files.update(_dcp_files(tmp))
                if per_rank is not None:
                    files.update(self._collect_ranks(tmp, generation))
                self._commit(step, tmp, files)
        except BaseException as err:
            self._abandon(tmp, generation, err)
            space = space_error(err, self.directory, nbytes(shared) + nbytes(per_rank))
            if space is not None:
                raise space from err
            raise

    def _abandon(self, tmp: Path, generation: str, err: BaseException) -> None:
        """A failed write leaves nothing that takes space. Rank 0 drops the whole temporary
        directory (the checkpoint is lost for every rank); another rank drops its own file and
        tells rank 0, which stops waiting for it."""
        if not tmp.is_dir():
            return
        if self.rank == 0:
            layout.remove(tmp)
            return
        layout.discard(tmp / f"rank-{self.rank}.pt")
        try:
            write_bytes_atomic(tmp / f"rank-{self.rank}.done", json.dumps(
                {"generation": generation, "error": f"{type(err).__name__}: {err}"[:2000]}).encode())
        except OSError:
            pass  # rank 0 then waits RANK_WAIT_S for this rank, as for a rank that died

    def _collect_ranks(self, tmp: Path, generation: str) -> dict[str, str]:
        """Wait for every rank's file of this generation; return name -> checksum info."""
        files, deadline = {}, time.monotonic() + RANK_WAIT_S
        for r in range(self.world_size):
            done = tmp / f"rank-{r}.done"
            while True:
                try:
                    info = json.loads(done.read_text())
                except (OSError, ValueError):
                    info = {}
                if isinstance(info, dict) and info.get("generation") == generation:
                    if "error" in info:
                        raise RuntimeError(f"rank {r} could not write its checkpoint file: {info['error']}")
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
        self._swap_in(step, tmp)
        self._problem(step, self.directory / layout.name("step", step), known="")
        self._prune(step)

    def _swap_in(self, step: int, tmp: Path) -> None:
        """Rename a temporary directory holding a verified marker to step-N. An existing step-N
        (the same step saved again after resuming from an older one) is first renamed to
        .step-N.old: a kill between the two renames leaves both, and _recover finishes the job."""
        final = self.directory / layout.name("step", step)
        if os.path.lexists(final):
            old = self.directory / layout.name("old", step)
            layout.discard(old)
            os.replace(final, old)
            os.replace(tmp, final)
            layout.discard(old)
        else:
            os.replace(tmp, final)
        fsync_dir(self.directory)

    def _recover(self) -> list[str]:
        """Rank 0, under the lock, before its first write: finish what a killed writer left half
        done. Returns what was found, in words, for a warning."""
        found, said = layout.scan(self.directory), []
        for step in sorted(set(found["tmp"]) | set(found["old"])):
            tmp, old = found["tmp"].get(step), found["old"].get(step)
            final = self.directory / layout.name("step", step)
            if tmp is not None and (tmp / MARKER).exists() and not layout.check(tmp)[0]:
                self._swap_in(step, tmp)
                said.append(f"finished the commit of checkpoint step {step}: {tmp} was complete "
                            "(its marker verifies) but the writer was stopped before renaming it")
            elif old is not None and not os.path.lexists(final) and not layout.check(old)[0]:
                os.replace(old, final)
                said.append(f"restored {final} from {old}: a re-save of step {step} was stopped "
                            "between its two renames, before the new copy was complete")
            if old is not None:
                layout.remove(old)
        for path in found["gone"].values():
            layout.discard(path)
        return said

    def _prune(self, committed: int) -> None:
        """Keep the newest `keep` valid checkpoints (and the one just committed). An invalid step-N
        never counts: it is set aside as .step-N.invalid with a warning, and deleted once `keep`
        valid checkpoints newer than it exist, so a run of broken directories can neither push
        out the good ones nor fill the disk."""
        found = layout.scan(self.directory)
        kept: list[int] = []
        for step in sorted(found["step"], reverse=True):
            path = found["step"][step]
            if len(kept) >= self.keep and step != committed:
                layout.remove(path)
                continue
            problem = self._problem(step, path)
            if not problem:
                kept.append(step)
                continue
            where = layout.set_aside(path, step)
            _warn(f"set aside checkpoint {path} as {where.name}: {problem}; it does not count "
                  f"toward keep={self.keep} and goes once {self.keep} newer valid ones exist")
        for step, path in found["invalid"].items():
            if sum(k > step for k in kept) >= self.keep:
                layout.remove(path)
        # Temporary dirs of steps before the one just committed are leftovers of killed writes:
        # every rank has finished them (rank 0 commits only after all ranks wrote).
        for step, path in found["tmp"].items():
            if step < committed:
                layout.remove(path)
        for path in found["gone"].values():
            layout.discard(path)

    def _problem(self, step: int, path: Path, known: str | None = None) -> str:
        """What is wrong with step-N ('' if valid), verified once per directory and marker."""
        ident = layout.identity(path)
        key = (step, *ident) if ident else None
        if known is not None:
            if key:
                self._checked[key] = known
            return known
        if key in self._checked:
            return self._checked[key]
        problem = layout.check(path)[0]
        if key:
            self._checked[key] = problem
        return problem

    # --------------------------------------------------------------- loading
    def steps(self) -> list[int]:
        """Steps of committed entries (valid or not), oldest first."""
        return sorted(layout.scan(self.directory)["step"])

    def latest(self) -> int | None:
        """Newest step whose checkpoint is complete and passes its checksums (nothing loaded)."""
        return self._walk(None, lambda path, names: True, warn=False)[0]

    def load(self, step: int | None = None, map_location: Any = "cpu") -> dict[str, Any] | None:
        """State of `step`, or of the newest valid checkpoint; None when there is none.

        Incomplete or corrupted checkpoints are skipped with a warning that names them. The
        returned dict holds this rank's own ``per_rank`` entry (None if it saved none). Safe
        while a writer saves and prunes: a checkpoint renamed or deleted under a read is read
        again from a fresh listing, so the result is always one complete checkpoint.
        """
        return self._walk(step, lambda path, names: self._read(path, names, map_location), warn=True)[1]

    def _walk(self, step: int | None, read: Any, warn: bool) -> tuple[int | None, Any]:
        for _ in range(READ_ATTEMPTS):
            result = self._walk_once(step, read, warn)
            if result is not _RACED:
                return result
        raise RuntimeError(
            f"every one of {READ_ATTEMPTS} reads of {self.directory} met a checkpoint being replaced. "
            "HINT: keep=2 or more leaves readers a complete checkpoint while the next is written.")

    def _walk_once(self, step: int | None, read: Any, warn: bool) -> Any:
        found = layout.scan(self.directory)
        steps = sorted(set(found["step"]) | set(found["tmp"]) | set(found["old"]), reverse=True)
        for s in steps if step is None else [step]:
            for kind in ("step", "tmp", "old"):
                path = found[kind].get(s)
                if path is None or (kind == "old" and s in found["step"]):
                    continue
                if kind != "step" and not os.path.lexists(path / MARKER):
                    if warn and kind == "tmp":
                        _warn(f"skipping incomplete checkpoint {path} (no completion marker: its "
                              "write was interrupted, or is still running)")
                    continue
                result = self._attempt(path, read)
                if result is _RACED:
                    return _RACED
                problem, value = result
                if problem:
                    _warn(f"skipping checkpoint {path}: {problem}") if warn else None
                    continue
                if warn and kind != "step":
                    _warn(f"loaded checkpoint step {s} from {path}: complete, but the writer was "
                          f"stopped before renaming it to step-{s}; its next save does that")
                return s, value
        return None, None

    def _attempt(self, path: Path, read: Any) -> Any:
        """(problem, value) of reading one entry, or _RACED when the writer renamed or deleted it
        meanwhile (its inode or marker changed): such a problem is the writer's, not the disk's."""
        before = layout.identity(path)
        if before is None:
            return _RACED
        problem, names = layout.check(path)
        value = None
        if not problem:
            try:
                value = read(path, names)
            except Exception as err:
                # torch.load reports a file deleted under it as a RuntimeError, not an OSError
                if layout.identity(path) != before:
                    return _RACED
                if not isinstance(err, (FileNotFoundError, NotADirectoryError)):
                    raise
                problem = f"{Path(err.filename or path).name} is missing"
            if isinstance(value, str):
                problem, value = value, None
        if layout.identity(path) != before:
            return _RACED
        return problem, value

    def _read(self, path: Path, names: set[str], map_location: Any) -> dict[str, Any] | str:
        state = load_file(path / SHARED, map_location)
        if not isinstance(state, dict):
            return f"{SHARED} holds a {type(state).__name__}, not a checkpoint's dict"
        own = f"rank-{self.rank}.pt"
        state[PER_RANK_KEY] = load_file(path / own, map_location) if own in names else None
        if DCP_METADATA in names:
            state[SHARDED_KEY] = path
        return state


def _dcp_files(tmp: Path) -> dict[str, dict]:
    """Checksum info of DCP's files in a temporary directory, every rank's shards included:
    DCP's coordinator writes .metadata only after all of them are written."""
    names = [DCP_METADATA] + sorted(n for n in os.listdir(tmp) if n.endswith(".distcp"))
    return {n: file_info(tmp / n) for n in names}


def _warn(message: str) -> None:
    log.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
