"""What a TrainLoop checkpoint holds of the loop's objects, and how a resume puts it back.

    state = loopstate.capture(objects, ("model", "optimizer"), step, extra, world_size)
    loopstate.restore(objects, state, ("model", "optimizer"), world_size, rank, seed)

Shared objects (model, optimizer: equal on every rank) go in rank 0's file; objects marked
``per_rank_state`` (data loader positions, hpc.runtime.sampler) and the RNG states (hpc.runtime.rng)
in each rank's own. The objects named in `dcp` are in neither: DCP saves and loads them
(hpc.checkpoint.dcp_engine). Per-rank state cannot carry over to another world size: those
objects start fresh, and every generator is reseeded from (seed, step, rank).
"""

from __future__ import annotations

import logging
from typing import Any

from hpc.runtime import rng
from hpc.runtime.resumepoint import per_rank, unwrap

log = logging.getLogger("hpc.trainloop")


def capture(objects: dict[str, Any], dcp: tuple[str, ...], step: int, extra: dict[str, Any],
            world_size: int) -> dict[str, Any]:
    """The state a checkpoint of `step` saves: each object's state_dict, shared or per rank."""
    split: dict[bool, dict[str, Any]] = {True: {}, False: {}}
    for k, o in objects.items():
        if k not in dcp:  # those are saved by DCP
            split[per_rank(o)][k] = unwrap(o).state_dict()
    return {"step": step, "extra": dict(extra), "objects": split[False], "world_size": world_size,
            "per_rank": {"rng": rng.capture(), "objects": split[True]}}


def restore(objects: dict[str, Any], state: dict[str, Any], dcp: tuple[str, ...], world_size: int,
            rank: int, seed: int) -> None:
    """Load each object's saved state (those in `dcp`: loaded by DCP already), then this rank's
    RNG states, or reseed them when the checkpoint was written by another world size."""
    step, mine = state["step"], state.get("per_rank") or {}
    saved_world = state.get("world_size", world_size)
    for name, obj in objects.items():
        if name in dcp:
            continue
        if per_rank(obj) and saved_world != world_size:
            log.warning("checkpoint step %d was written by %d ranks: the per-rank state of %r "
                        "cannot carry over to %d; it starts fresh", step, saved_world, name, world_size)
            continue
        saved = (mine.get("objects", {}) if per_rank(obj) else state["objects"]).get(name)
        if saved is None and not per_rank(obj):  # a loader position, written per rank before
            saved = mine.get("objects", {}).get(name)  # positions were global
        if saved is None:  # e.g. a data loader registered after this checkpoint was written
            log.warning("checkpoint step %d has no state for %r: it starts fresh", step, name)
            continue
        unwrap(obj).load_state_dict(saved)
    if saved_world == world_size and mine:
        rng.restore(mine["rng"])
    else:
        rng.seed_all(rng.derive_seed(seed, step, rank))
        log.warning("checkpoint step %d was written by %d ranks, this run has %d: per-rank RNG "
                    "states cannot carry over, so every generator is reseeded from (seed=%d, "
                    "step=%d, rank). Model, optimizer and data position resume exactly; random "
                    "draws (dropout, augmentation) differ from an uninterrupted run's",
                    step, saved_world, world_size, seed, step)
