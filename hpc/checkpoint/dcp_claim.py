"""What each rank wrote of a save without DCP's collectives, in two numbers: rank 0 checks that the
ranks' parts cover the whole state without reading any of them.

    claim = counts(flat_state, kept_items)      # each rank's save planner (replicas.SharePlanner)
    record(directory, rank, claim)              # ... and the store, from its report:
    claim = take(directory, rank)               # {"expected": int, "written": int}
    check(tmp, {0: claim_0, 1: claim_1, ...})   # rank 0 at the commit: ValueError when not whole

Every entry e of the saved state (a tensor of n(e) elements, or a non-tensor value, counted as 1)
has a weight w(e), a 61-bit hash of its name. Each rank computes, modulo the prime 2^61 - 1,

    expected = sum over all entries of w(e) * n(e)           (the same on every rank of one model)
    written  = sum over the pieces it writes of w(e) * elements of the piece

and rank 0 checks that every rank expects what it expects (the ranks saved the same state) and that
the ranks' written sums add up to it: O(ranks), where merging their DCP indexes to check them was
O(ranks x tensors) (11 s of CPU at 512 ranks, BENCHMARKS.md). A value no rank wrote, or a piece of a
tensor missing or written twice, moves the sum by w(e) times the elements missing or extra; errors
in different entries cancel with a chance of about one in 2^61. A missing piece of a tensor and a
second copy of another piece of the same tensor, the same size, would cancel, as they did in the
merge's check (elements covered against the tensor's); a load checks that the chunks it reads cover
what it loads (dcp_index.uncovered). A DTensor piece that several ranks hold (replicated over a mesh
dimension) counts for one: the rank at coordinate 0 of each dimension it is not sharded over; a
replicated value every rank writes a copy of (beside sharded state) counts for rank 0's. On a
mismatch rank 0 merges the parts after all, to name what is missing: a failed commit may be slow.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import threading
from typing import Any

from hpc.checkpoint import dcp_index

__all__ = ["PRIME", "counts", "record", "take", "check"]

PRIME = 2**61 - 1
_claims: dict[tuple[str, int], dict[str, int]] = {}
_lock = threading.Lock()


@functools.lru_cache(maxsize=65536)
def weight(fqn: str) -> int:
    return int.from_bytes(hashlib.blake2b(fqn.encode(), digest_size=8).digest(), "little") % PRIME or 1


def _counts_once(obj: Any) -> bool:
    """Whether this rank's copy of a DTensor piece is the one counted (see the module docstring)."""
    placements = getattr(obj, "placements", None)
    if placements is None:
        return True
    coordinate = obj.device_mesh.get_coordinate() or ()
    return all(c == 0 for c, p in zip(coordinate, placements) if not p.is_shard())


def counts(state: dict[str, Any], items: list, rank: int = 0, copies: bool = False) -> dict[str, int]:
    """The claim of `rank`, whose flattened state is `state` and which writes DCP's WriteItems
    `items`. copies: every rank writes its own copy of the replicated entries (the plain tensors
    and the values beside sharded state, hpc.checkpoint.replicas): rank 0's copy is the one counted."""
    import torch
    from torch.distributed.checkpoint.planner import WriteItemType

    expected = sum(weight(fqn) * (obj.numel() if isinstance(obj, torch.Tensor) else 1)
                   for fqn, obj in state.items()) % PRIME
    written = 0
    for item in items:
        fqn = item.index.fqn
        if copies and rank != 0 and item.type != WriteItemType.SHARD:
            continue
        if item.type == WriteItemType.BYTE_IO:
            written += weight(fqn)
        elif _counts_once(state.get(fqn)):
            written += weight(fqn) * math.prod(item.tensor_data.chunk.sizes)
    return {"expected": expected, "written": written % PRIME}


def _key(directory: Any, rank: int) -> tuple[str, int]:
    return os.path.abspath(os.fspath(directory)), rank


def record(directory: Any, rank: int, claim: dict[str, int]) -> None:
    """Keep a save's claim for the store's report (the save plans on DCP's thread, in this process)."""
    with _lock:
        if len(_claims) >= 1024:  # claims of saves no commit asked for (failed ones)
            _claims.clear()
        _claims[_key(directory, rank)] = claim


def take(directory: Any, rank: int) -> dict[str, int] | None:
    """The claim recorded for `rank`'s save into `directory` (once), None after a save with collectives."""
    with _lock:
        return _claims.pop(_key(directory, rank), None)


def check(directory: Any, claims: dict[int, Any], world_size: int) -> None:
    """Rank 0's check of the ranks' claims (rank -> claim, from their reports): ValueError with a
    HINT when a rank saved another state or the parts leave a value unwritten or a tensor short."""
    odd = [r for r in range(world_size) if not isinstance(claims.get(r), dict)]
    if odd:
        raise ValueError(f"rank {odd[0]} saved its shards into {directory} with DCP's collectives, rank 0 "
                         "without them (or the other way round). HINT: every rank must call save() alike.")
    expected = claims[0]["expected"]
    other = [r for r in range(world_size) if claims[r]["expected"] != expected]
    if other:
        raise ValueError(f"rank {other[0]} saved a different state from rank 0's into {directory} (other names "
                         "or sizes). HINT: every rank must save the same model and optimizer, built the same way.")
    if sum(claims[r]["written"] for r in range(world_size)) % PRIME == expected:
        return
    # the parts, read only to name what a failed commit lacks
    unwritten, partial = dcp_index.holes(dcp_index.merge(dcp_index.read_parts(directory, range(world_size))))
    if not (unwritten or partial):
        partial = ["a piece written by two ranks"]
    raise ValueError(dcp_index.hole_error(directory, unwritten, partial))
