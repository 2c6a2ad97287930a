"""Model and optimizer state through torch.distributed.checkpoint (DCP): sharded, resharded on load.

    python -c "from hpc.checkpoint.dcp_engine import DcpEngine; help(DcpEngine)"

    with DcpEngine(s) as engine:                   # every rank, at the same point
        engine.save(tmp_dir, model, opt)           # blocks for the staging copy only
        ...                                        # training goes on while a thread writes
        engine.wait()                              # the files and DCP's .metadata are on disk
        engine.load(step_dir, model, opt)          # written by any world size, either strategy

        engine.save(tmp_dir, model, opt, collectives=False)   # no collective: a part per rank,
        ...                                                    # (hpc.checkpoint.store commits them)
        engine.load(step_dir, model, opt)                      # reads the ranks' index parts it needs

State goes through ``get_state_dict``/``set_state_dict``, so keys are the model's own names
whatever wraps it (DDP's ``module.`` prefix, FSDP) and optimizer state is keyed by parameter
name, not by position: that is what lets DCP match pieces across world sizes. Under FSDP each
rank writes its own shards; under DDP every rank holds the same tensors and the ranks split them
(hpc.checkpoint.replicas), so the state is written once, spread over the ranks. A load reads, for
every tensor of this rank's layout, the pieces of it that the writers stored: resharding from
N writers to M readers needs no extra step.

Asynchronous saves copy the state into staging buffers that are reused from save to save
(pinned host memory on CUDA, so the copy runs at DMA speed), then a thread writes them while
training goes on. Each rank copies only what it writes (its shards, or its share of the
replicated tensors): staging memory and the copy's stall are the rank's share, not the whole
state. DCP's collectives of a save (plans, metadata) then run on that thread: they get their
own gloo group, because on the training's group they would interleave with the training's
collectives (and NCCL cannot carry the CPU tensors DCP exchanges).

A save without collectives (what TrainLoop's checkpoints use) skips DCP's exchanges altogether:
the ranks already agree on who writes what (hpc.checkpoint.replicas), so each rank plans and
writes its part on its own, with DCP's index of that part beside it; the commit keeps every part
and checks, from each rank's claim of what it wrote, that together they cover the state
(hpc.checkpoint.dcp_claim, hpc.checkpoint.store), and a load reads the parts it needs
(hpc.checkpoint.dcp_index, dcp_reader): under FSDP on the layout that saved, its own only. A DCP
save's collectives are a gather of every rank's plan to rank 0, a scatter back, and a gather of
every rank's write results: per save, 4 object collectives and rank 0 handling every rank's plan
while the others wait (bench.index_merge), and a rank that dies leaves the others waiting in the
next one until the group's timeout. Without them no rank waits inside a save: a failed rank fails
alone, and the commit says which (or, for a rank that died, times out naming it).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from hpc.checkpoint import dcp_claim, dcp_reader, optim_state, shardcrc
from hpc.checkpoint.dcp_index import METADATA, rank_metadata
from hpc.checkpoint.dcp_pickle import UnsafeCheckpoint
from hpc.checkpoint.dcp_reader import ShardCorrupt
from hpc.checkpoint.replicas import SharePlanner, ShareStager, share
from hpc.checkpoint.staging import source_devices, synchronize, tensors_in

__all__ = ["DcpEngine", "ShardCorrupt", "UnsafeCheckpoint", "state_dicts", "METADATA"]

SINGLE_PROCESS_WARNING = r"torch\.distributed is disabled, unavailable or uninitialized"


def state_dicts(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                as_it_is: bool = False) -> dict:
    """{"model": ..., "optimizer": ...} keyed by parameter names, as DCP saves and loads them.
    as_it_is: the optimizer's state as it is, not filled in by a step (hpc.checkpoint.optim_state)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    with optim_state.as_it_is(optimizer, as_it_is):
        model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optimizer": optim_sd}


@contextlib.contextmanager
def _plain_errors(rank: int):
    """Raise a failed save's or load's own error (OSError, ...) instead of DCP's wrapper.

    DCP gathers every rank's failure into a CheckpointException, which derives from
    BaseException: `except Exception` would let it through, and its message names only the
    ranks. This rank's error, or else the first failing rank's, is what the caller can act on.
    """
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as wrapped:
        failures = wrapped.failures
        error = failures[rank][0] if rank in failures else next(iter(failures.values()))[0]
        if isinstance(error, Exception):
            raise error from wrapped
        raise


class DcpEngine:
    """Saves and loads one model (and optimizer) of a session; one save in flight at most."""

    def __init__(self, session: Any = None, pinned: bool | None = None):
        device = session.device if session is not None else torch.device("cpu")
        self.distributed = bool(session is not None and session.distributed)
        self.rank = session.rank if session is not None else 0
        self.world = session.world_size if self.distributed else 1
        self._session = session
        # DCP warns that it assumes a single process: alone, or in a save without collectives,
        # that is the intent, not a mistake. A filter, not catch_warnings: the asynchronous save
        # warns from its own thread.
        warnings.filterwarnings("ignore", SINGLE_PROCESS_WARNING, UserWarning)
        # DCP's collectives get a gloo group of their own, made at the first save or load that
        # uses them (a collective: every rank makes that call at the same point). TrainLoop's
        # saves and loads use none, so a resume opens no group (a full mesh of connections).
        self.group: Any = None
        self.pinned = device.type == "cuda" if pinned is None else pinned
        self._stager: ShareStager | None = None  # buffers of this rank's share, kept between saves
        self._pending: Any = None
        self._writer: tuple[int, ThreadPoolExecutor] | None = None  # (pid, the saves' thread)

    # -- saving ----------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike, model: torch.nn.Module,
             optimizer: torch.optim.Optimizer | None = None, blocking: bool = False,
             collectives: bool = True) -> None:
        """Write the state under `directory` (the same path on every rank; all ranks call).

        collectives=False: no rank waits for another. Each writes its part and DCP's index of it
        (rank_metadata), and records its claim of what it wrote (dcp_claim) for the commit; the
        checkpoint loads once every rank's save finished. A rank's failure is raised on that rank only."""
        import torch.distributed.checkpoint as dcp

        self.wait()  # one save at a time: its staging buffers are the next one's
        optim_state.watch(optimizer)  # from the next save on, a stepped optimizer's state is taken as it is
        state = state_dicts(model, optimizer, as_it_is=optim_state.stepped(optimizer))
        # DCP copies on each tensor's current stream: work on a side stream or another device
        # must have finished first, or the checkpoint holds half an update that its checksum vouches for.
        synchronize(source_devices(tensors_in(state)))
        rank, world = self._rank_world()
        # An index of this rank's part left in `directory` by an earlier save that was stopped (a
        # killed attempt at the same step) would be taken for this save's: the commit tells a save
        # without collectives by that file, and reads this rank's ranges from it.
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):  # DCP reports a bad path itself
            (Path(directory) / rank_metadata(rank)).unlink()
        dcp_claim.take(directory, rank)  # and so would its claim, kept for a commit that never came
        if collectives:
            where = {"process_group": self._group(), "storage_writer": shardcrc.writer(directory)}
        else:  # DCP as one process, writing under this rank's name
            where = {"no_dist": True, "storage_writer": shardcrc.writer(directory, rank=rank)}
        split_values = None if collectives else (rank, world)  # non-tensor values: each written once
        claim_as = None if collectives else (directory, rank)  # what it wrote, for the commit's check
        if blocking:
            planner = None if collectives else SharePlanner(share(list(tensors_in(state)), rank, world),
                                                            split_values, claim_as)
            with _plain_errors(self.rank):
                dcp.save(state, checkpoint_id=str(directory), planner=planner, **where)
            return
        with _plain_errors(self.rank):
            stager = self._staging()
            staged = stager.stage(state)
        # What DCP's async_save does (stage, then save on a thread), on a thread kept for every
        # save: async_save starts a new one per save, and waiting for it to start was most of a
        # small state's stall on a busy node (BENCHMARKS.md, section 2).
        self._pending = self._thread().submit(dcp.save, staged, checkpoint_id=str(directory),
                                              planner=SharePlanner(stager.staged, split_values, claim_as), **where)

    def _rank_world(self) -> tuple[int, int]:
        return self.rank if self.distributed else 0, self.world

    def _group(self) -> Any:
        """The group of DCP's collectives: the session's (they time out with the session's
        timeout_s, then train_timeout_s, not after torch's 30 minutes), made on first use."""
        if self.group is None and self.distributed:
            self.group = self._session.new_group("gloo")
        return self.group

    def _thread(self) -> ThreadPoolExecutor:
        if self._writer is None or self._writer[0] != os.getpid():  # threads do not survive fork
            self._writer = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="checkpoint-dcp"))
        return self._writer[1]

    def _staging(self) -> ShareStager:
        if self._stager is None:
            self._stager = ShareStager(self.pinned, *self._rank_world())
        return self._stager

    def wait(self) -> None:
        """Block until the save in flight is on disk; re-raise its error here if it failed."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        with _plain_errors(self.rank):
            pending.result()

    @property
    def staged_bytes(self) -> int | None:
        """Bytes this rank copied at its last asynchronous save: its share of the state under DDP,
        its shards under FSDP, all of it in one process; None before the first."""
        return self._stager.staged_bytes if self._stager is not None else None

    @property
    def busy(self) -> bool:
        return self._pending is not None and not self._pending.done()

    # -- loading ---------------------------------------------------------------------------
    def load(self, directory: str | os.PathLike, model: torch.nn.Module,
             optimizer: torch.optim.Optimizer | None = None, files: dict | None = None,
             collectives: bool = True) -> None:
        """Fill model (and optimizer) from `directory`, whatever world size wrote it. With `files`
        (the completion marker's checksums) every byte read is checked as it is read; a mismatch
        on any rank raises ShardCorrupt on every rank, after which the model may hold part of
        this checkpoint: load another one before training. Nothing pickled is run: an index or a
        value that is not plain data raises UnsafeCheckpoint (hpc.checkpoint.dcp_pickle).

        collectives=False: each rank plans its reads from DCP's index alone (a load's plan needs
        nothing from the other ranks), no group is made, and a failure is raised on its own rank
        only: the caller agrees on the outcome (TrainLoop: one all-reduce, hpc.runtime.resumepoint)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        self.wait()
        reader = dcp_reader.reader(directory, files, self._rank_world()[0])
        # DCP's index, read here first (once: the reader keeps it): DCP takes any error reading it
        # for a missing index and falls back to the ranks' own, so a refused one must stop the load here.
        # A checkpoint without optimizer state (one that keeps none, or saved before it had any)
        # loads into the optimizer's state as it is: filling it in first would ask the checkpoint
        # for state it does not hold.
        holds_optimizer = dcp_reader.holds_optimizer_state(reader)
        as_it_is = optimizer is not None and not optimizer.state and not holds_optimizer
        state = state_dicts(model, optimizer, as_it_is)  # this rank's layout: what to read, and where
        reader.select(state)  # the ranks' index parts that hold it (a checkpoint saved without collectives)
        try:
            with _plain_errors(self.rank):
                where = {"process_group": self._group()} if collectives else {"no_dist": True}
                dcp.load(state, checkpoint_id=str(directory), storage_reader=reader,
                         planner=dcp_reader.planner(directory), **where)
        except Exception:
            reader.raise_refusal()  # a rank's own index refused: DCP reports it as "metadata is None"
            raise
        if optimizer is None:
            set_model_state_dict(model, state["model"])
        else:
            with optim_state.as_it_is(optimizer, as_it_is):
                set_state_dict(model, optimizer, model_state_dict=state["model"],
                               optim_state_dict=state["optimizer"])

    # -- scope -----------------------------------------------------------------------------
    def close(self) -> None:
        """Finish the save in flight and free the staging buffers."""
        try:
            self.wait()
        finally:
            self._stager = None
            if self._writer is not None and self._writer[0] == os.getpid():
                self._writer[1].shutdown(wait=True)
            self._writer = None
            # The group is not destroyed here but with the session's process group, which takes
            # every group with it: destroying it alone while a peer may still be tearing down its
            # side aborted the process at exit ("terminate called without an active exception")
            # in about one FSDP run in ten here, and never in 24 runs without it.
            self.group = None

    def __enter__(self) -> "DcpEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
