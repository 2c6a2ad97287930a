"""Writing a checkpoint store: every rank saves, rank 0 commits (the renames, recovery and pruning
are hpc.checkpoint.commit's).

    store = CheckpointStore("run/stage/checkpoints", keep=3, rank=s.rank, world_size=s.world_size)
    store.save(step, {"model": m.state_dict(), "per_rank": {"rng": rng.capture()}})

The layout and the guarantees are in the package docstring (hpc.checkpoint); loading is the
StoreReader's (hpc.checkpoint.reader), which this class extends.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from hpc.checkpoint import background_writer as background
from hpc.checkpoint import commit, dcp_claim, layout, rank_lists, reports, shardcrc
from hpc.checkpoint.checksums import file_info
from hpc.checkpoint.files import nbytes, space_error, write_atomic
from hpc.checkpoint.layout import DCP_METADATA, MARKER, SHARED
from hpc.checkpoint.reader import PER_RANK_KEY, StoreReader, warn_user
from hpc.checkpoint.staging import Staging, source_devices, synchronize, tensors_in
from hpc.checkpoint.writer_lock import StoreLocked, WriterLock, wait_for_owner
from hpc.checkpoint.writer_lock import generation as job_attempt
from hpc.fs.atomic import write_bytes

__all__ = ["CheckpointStore", "StoreLocked", "AUTO_FORK_BYTES", "RANK_WAIT_S"]

# How long rank 0 waits for the other ranks' files before giving up on a checkpoint.
RANK_WAIT_S = 600.0
# mode="auto": a forked writer from this much CPU state, a thread below (crossover: BENCHMARKS.md 2)
AUTO_FORK_BYTES = 256 * 2**20


class CheckpointStore(StoreReader):
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
        super().__init__(directory, rank)
        self.keep, self.world_size = keep, world_size
        self.directory.mkdir(parents=True, exist_ok=True)
        self._job: Any = None
        self._pending: int | None = None  # step of the background write in flight
        self._lock: WriterLock | None = None  # rank 0's, taken at the first save (readers never lock)
        self._claimed = False
        # What this rank reads besides shards and DCP's index; those are checked as DCP reads
        # them (dcp_reader), each once. Of the other ranks' files not one is looked at (scope).
        self.crc, self.scope = {SHARED, layout.rank_state(rank)}, rank
        self._staging = Staging()
        self._writer = background.ThreadWriter()
        self.stats = {"saves": 0, "copy_s": 0.0, "waited_s": 0.0, "write_s": 0.0}

    # ---------------------------------------------------------------- saving
    def save(self, step: int, state: dict[str, Any], blocking: bool = False,
             sharded: Any = None) -> None:
        """Checkpoint `state` as step `step`; every rank calls this with the same step.

        `sharded(directory, blocking)` (optional, every rank) writes model and optimizer shards
        into the checkpoint's temporary directory through DCP and returns a function that waits
        for them. Each rank then checksums its own shards and lists them with its rank file in its
        list (rank_lists); rank 0's marker names the lists from the reports, reading no rank's data. Shards
        saved without DCP's collectives (DcpEngine.save(collectives=False)) come with each
        rank's index of its part, committed as it is (a load reads the parts it needs), and a
        claim of what the rank wrote: rank 0 checks from the claims that the parts cover the
        whole state, in O(ranks) (hpc.checkpoint.dcp_claim). Such a save runs on the writer
        thread (a forked writer cannot wait on DCP's thread).

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
        args = [int(step), own, state.get(PER_RANK_KEY), job_attempt()]
        shards = None if sharded is None else sharded(self.directory / layout.name("tmp", step), blocking)
        self.stats["saves"] += 1
        self.stats["waited_s"] += t1 - t0
        if blocking:
            synchronize(source_devices(tensors_in(args[1:3])))  # every stream and device (see Staging)
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
        copying into reused buffers (cost grows with the bytes) is cheaper than a fork (it copies
        the page tables of the whole process, torch's included); BENCHMARKS.md times both sides."""
        if self.mode != "auto":
            return self.mode
        if background.default_mode() == "thread" or nbytes(state, cpu_only=True) < AUTO_FORK_BYTES:
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
        generation = job_attempt()
        if self.rank == 0:
            lock = WriterLock(self.directory, generation)
            lock.acquire()
            self._lock = lock
            for message in commit.recover(self.directory):
                warn_user(message)
        else:
            wait_for_owner(self.directory, generation)
        self._claimed = True

    def _write(self, step: int, shared: Any, per_rank: Any, generation: str,
               overlap: bool = False, shards: Any = None) -> None:
        tmp = self.directory / layout.name("tmp", step)
        try:
            tmp.mkdir(exist_ok=True)
            report: dict[str, Any] = {"generation": generation}
            own: dict[str, Any] = {}  # this rank's files: committed as its list (rank_lists)
            if shards is not None:
                shards()  # this rank's shards on disk, with DCP's index of them (or, with
                # DCP's collectives, its .metadata on rank 0)
                own.update(shardcrc.own_shards(tmp, self.rank))
                report["claim"] = dcp_claim.take(tmp, self.rank)  # None with DCP's collectives
            if per_rank is not None:
                mine = layout.rank_state(self.rank)
                own[mine] = write_atomic(tmp / mine, per_rank, overlap)
            if own:
                report["list"] = rank_lists.write(tmp, self.rank, own)
            if len(report) > 1 and self.rank > 0:
                reports.send(tmp, self.rank, report)
            if self.rank == 0:
                files = {SHARED: write_atomic(tmp / SHARED, shared, overlap)}
                claims = {0: report.get("claim")}
                if len(report) > 1:  # the marker names each rank's list, none of their files
                    files.update(reports.files_of(report, 0))
                    files.update(reports.collect(tmp, self.world_size, generation, RANK_WAIT_S, claims))
                if claims[0] is not None:  # saved without collectives: each rank's index part is
                    dcp_claim.check(tmp, claims, self.world_size)  # listed; none is read (dcp_claim)
                elif shards is not None:  # DCP's coordinator wrote the merged index
                    files[DCP_METADATA] = file_info(tmp / DCP_METADATA)
                layout.drop_unlisted(tmp, files)  # the reports: read, done
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
        layout.discard(tmp / layout.rank_state(self.rank))
        layout.discard(tmp / layout.rank_list(self.rank))
        reports.send_error(tmp, self.rank, generation, err)

    def _commit(self, step: int, tmp: Path, files: dict[str, str]) -> None:
        marker = {"step": step, "world_size": self.world_size, "files": files, "time": time.time()}
        # compact: json's C encoder runs only without indent. The ranks' crc32s per tensor are in
        # their lists: the marker holds a few entries per rank (rank_lists)
        write_bytes(tmp / MARKER, json.dumps(marker).encode())
        commit.swap_in(self.directory, step, tmp)
        self._problem(step, self.directory / layout.name("step", step), known="")
        commit.prune(self.directory, step, self.keep, self._problem)
