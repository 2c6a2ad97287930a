"""Asynchronous DCP saves that copy only what this rank writes: its share of the replicated
tensors (DDP: every rank holds the same ones), and its own shards of DTensors (FSDP).

    stager = ShareStager(pinned=False, rank=r, world=w)
    staged = stager.stage(state)                     # in the training thread: the stall
    dcp.save(staged, ..., planner=SharePlanner(stager.staged))   # on a writer thread (dcp_engine)

DCP's own deduplication picks the rank that writes a replicated tensor inside the save, after
staging: every rank would first copy the whole model and optimizer into its staging buffers. At
8 GPUs a node that is 8 full copies in the node's host memory, and every rank's stall is the
copy of all of it. Here the ranks agree on the split before staging, without a collective: the
same greedy split by size over the same walk of the same state gives every rank the same answer.
Each rank stages its share and plans to write exactly the tensors it staged, so no rank ever
writes a live tensor that training goes on changing; what a rank did not stage, another did.
The same split lets a save run without DCP's collectives at all (dcp_engine, collectives=False):
every rank knows its part of the plan without asking rank 0.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Any

from torch.distributed.checkpoint import DefaultSavePlanner
from torch.distributed.checkpoint.planner import SavePlan, WriteItemType

from hpc.checkpoint import dcp_claim
from hpc.checkpoint.staging import Staging, is_dtensor, tensors_in

__all__ = ["split", "share", "copies_everywhere", "ShareStager", "SharePlanner"]


def _local(t: Any) -> Any:
    return t.to_local() if is_dtensor(t) else t


def split(sizes: list[int], world: int) -> list[int]:
    """The rank that writes each of `sizes` (bytes, in walk order): the least loaded so far, the
    lowest of equals. Deterministic, so every rank computes the same split on its own. A heap of
    (load, rank): the split runs inside every save's stall, and a scan of all ranks per tensor
    would grow with tensors x ranks (an optimizer's thousands of tensors at 512 ranks)."""
    heap = [(0, rank) for rank in range(world)]  # sorted, so already a heap
    owners = []
    for size in sizes:
        load, rank = heapq.heappop(heap)
        owners.append(rank)
        heapq.heappush(heap, (load + max(size, 1), rank))
    return owners


def share(tensors: list[Any], rank: int, world: int) -> set[int]:
    """ids of the tensors among `tensors` (a state's, in walk order) that `rank` writes: its own
    DTensor shards, and its part of the plain (replicated) tensors. Beside sharded state (FSDP)
    every rank writes its own copy of the plain ones (AdamW's per-parameter `step`, buffers):
    every rank reads them whole at a load, and from its own file it opens no other rank's. Spread
    by `split` they made each rank open every other rank's file (O(W) per rank, O(W^2) in all);
    all in rank 0's file, every rank opened that one besides its own. The copies are what each
    rank reads at a load anyway, so its write grows by its read; the ranks together store W
    copies of values that are small beside the shards. Without DTensors (DDP: every tensor
    replicated) they are spread by `split`, so that no rank writes the whole state."""
    shards = {id(t) for t in tensors if is_dtensor(t)}  # a DTensor's shard is this rank's own
    replicas = [t for t in tensors if id(t) not in shards]
    if shards:
        return shards | {id(t) for t in replicas}
    owners = split([t.numel() * t.element_size() for t in replicas], world)
    return shards | {id(t) for t, owner in zip(replicas, owners) if owner == rank}


def copies_everywhere(state: dict) -> bool:
    """Whether every rank writes its own copy of the replicated values of `state` (flattened):
    beside sharded state, as `share` decides."""
    return any(is_dtensor(v) for v in state.values())


class ShareStager:
    """hpc's Staging for a DCP save: this rank's share of the plain (replicated)
    tensors and the local shards of its DTensors are copied into buffers kept from save to save
    (CPU copies cut across the job's cores; DCP's DefaultStager allocates fresh ones and copies on
    one thread). The other ranks' plain tensors are left as they are, and SharePlanner keeps them
    out of this rank's writes. Synchronous: when stage() returns, training may change the live
    tensors."""

    def __init__(self, pinned: bool, rank: int = 0, world: int = 1) -> None:
        self.pinned, self.rank, self.world = pinned, rank, world
        self._staging = Staging(private=True)  # DCP's writer is a thread of this process
        self.staged: set[int] = set()  # ids of the buffers the last stage() filled
        self.staged_bytes = 0

    def stage(self, state: dict) -> dict:
        tensors = list(tensors_in(state))
        mine = share(tensors, self.rank, self.world)
        out = self._staging.stage(state, cpu_too=True, pin=self.pinned, only=lambda t: id(t) in mine)
        live = {id(t) for t in tensors}
        buffers = [t for t in tensors_in(out) if id(t) not in live]
        self.staged = {id(t) for t in buffers}
        self.staged_bytes = sum(_local(t).numel() * t.element_size() for t in buffers)
        return out


class SharePlanner(DefaultSavePlanner):
    """DCP's default save plan, less the tensors this rank does not write: `keep` holds the ids
    of those it does (ShareStager.staged, or `share` of a live state). Non-tensor values
    (optimizer hyperparameters, from get_state_dict's fresh dictionaries) are the same on every
    rank. By default every rank plans them and DCP's collectives keep one copy; for a save
    without those collectives, `split_values=(rank, world)` has each written where a load reads
    it: beside sharded state by every rank (each reads its own copy, as of the plain tensors),
    else by rank 0 only (under DDP a load reads every rank's file anyway). They are a few kB of
    hyperparameters. `claim_as=(directory, rank)`: what this rank writes of the whole, for the
    commit's check without DCP's collectives (hpc.checkpoint.dcp_claim)."""

    def __init__(self, keep: set[int], split_values: tuple[int, int] | None = None,
                 claim_as: tuple[Any, int] | None = None) -> None:
        super().__init__()
        self.keep, self.split_values, self.claim_as = keep, split_values, claim_as

    def create_local_plan(self) -> SavePlan:
        plan = super().create_local_plan()
        values = sorted(item.index.fqn for item in plan.items if item.type == WriteItemType.BYTE_IO)
        copies = copies_everywhere(self.state_dict)
        if self.split_values is not None and self.split_values[0] != 0 and not copies:
            values = []
        mine = set(values)
        keep = [item for item in plan.items
                if (item.index.fqn in mine if item.type == WriteItemType.BYTE_IO
                    else id(self.state_dict[item.index.fqn]) in self.keep)]
        self.plan = dataclasses.replace(plan, items=keep)
        if self.claim_as is not None:
            dcp_claim.record(*self.claim_as, dcp_claim.counts(self.state_dict, keep, self.claim_as[1], copies))
        return self.plan
