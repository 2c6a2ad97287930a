"""Which checkpoint a TrainLoop resumes from, and which of its objects go through DCP.

    objects = {"model": model, "optimizer": opt, "loader": loader}
    if through_dcp(objects):
        names = sharded_objects(objects)            # ("model", "optimizer")
    state = agreed_state(store, session, load_shards)

The newest checkpoint is not always readable by every rank: a rank may find one of its own files
corrupt, or a shard that only its DCP load plan reads. Each rank checks only what it reads, and one
all-reduce per candidate makes every rank settle on the same step, so all ranks start the same
training step (a rank on another step would deadlock the first collective).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from hpc.checkpoint import FILES_KEY, SHARDED_KEY

log = logging.getLogger("hpc.trainloop")


def _fsdp(obj: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(obj, FSDPModule)


def through_dcp(objects: dict[str, Any]) -> bool:
    """The model and its optimizer go through DCP whenever they can (one model, at most one
    optimizer), whatever the strategy and world size: one format, so that any checkpoint
    resumes under either strategy on any world size. Under FSDP they must."""
    objs = list(objects.values())
    models = sum(isinstance(o, torch.nn.Module) for o in objs)
    optims = sum(isinstance(o, torch.optim.Optimizer) for o in objs)
    return any(_fsdp(o) for o in objs) or (models == 1 and optims <= 1)


def sharded_objects(objects: dict[str, Any]) -> tuple[str, ...]:
    """Names of the model and its optimizer that go through DCP: one model, at most one
    optimizer (get_state_dict pairs them to key optimizer state by parameter name)."""
    models = [n for n, o in objects.items() if isinstance(o, torch.nn.Module)]
    optims = [n for n, o in objects.items() if isinstance(o, torch.optim.Optimizer)]
    if len(models) != 1 or len(optims) > 1:
        raise ValueError(
            f"sharded checkpoints need one model and at most one optimizer; got models "
            f"{models} and optimizers {optims}. HINT: register them as one nn.Module (an "
            "nn.ModuleDict of the parts) with one optimizer over all their parameters.")
    return (models[0], *optims)


def agreed_state(store: Any, session: Any, load_shards: Callable[[Path, Any], str]) -> dict[str, Any] | None:
    """The newest checkpoint of `store` that every rank can read, its shards already loaded by
    `load_shards` (which checks each byte it reads against the marker: '' if all matched, else
    what did not). A corrupt file makes every rank go back to the same older step, whose load
    overwrites whatever the failed one left in the model."""
    partial = -1  # a step whose shards failed their checksums midway through loading
    for step in sorted(store.candidates(), reverse=True) + [-1]:
        state = store.load(step) if step >= 0 else None
        if step >= 0 and state is None:
            log.warning("skipping checkpoint step %d: it failed verification", step)
        if not agree(session, store.directory, step, step < 0 or state is not None):
            log.warning("checkpoint step %d failed verification on some rank: trying an older one", step)
            continue
        if state is None:
            return _nothing_left(store.directory, partial)
        if state.get(SHARDED_KEY) is None:
            return state
        problem = load_shards(state[SHARDED_KEY], state.get(FILES_KEY))  # the same step on every rank (agreed)
        if agree(session, store.directory, step, not problem):
            return state
        partial = step
        log.warning("skipping checkpoint step %d: %s", step, problem or "another rank's shard is corrupt")
    return None


def _nothing_left(directory: Path, partial: int) -> None:
    if partial >= 0:
        raise RuntimeError(
            f"no checkpoint in {directory} is intact, and loading step {partial} had overwritten part "
            "of the model before its corruption was found, so training cannot start fresh in this "
            "process. HINT: restore an intact copy of the checkpoints, or move "
            f"{directory} aside and resubmit to start fresh.")
    return None


def agree(session: Any, directory: Path, step: int, ok: bool) -> bool:
    """One all-reduce: whether every rank can read `step`; the ranks must name the same step,
    or the first training step would deadlock."""
    if not session.distributed:
        return ok
    t = torch.tensor([int(ok), step, -step], dtype=torch.int64, device=session.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    if int(t[1]) != -int(t[2]):
        raise RuntimeError(
            f"ranks found different checkpoints (steps {int(t[1])}..{-int(t[2])}) in "
            f"{directory}. HINT: every rank must see the same shared filesystem path.")
    return bool(t[0])


def unwrap(obj: Any) -> Any:
    # DDP prefixes keys with "module."; saving the inner module lets a run resume with or without DDP.
    return obj.module if isinstance(obj, torch.nn.parallel.DistributedDataParallel) else obj


def per_rank(obj: Any) -> bool:
    return bool(getattr(obj, "per_rank_state", False))  # hpc.runtime.sampler.ResumableLoader
