"""Round-robin sharding of an index list across ranks, reshuffled every epoch.

    from hpc.runtime.sharding import round_robin; round_robin(10, rank=1, world_size=4, epoch=0, seed=0)

LangSplat's camera distribution done once: every rank computes the same permutation (seeded
by seed + epoch, so no communication is needed), the uneven tail is dropped so that every rank
does n_items // world_size steps (a rank with one step more would wait forever in the
gradient all-reduce), and rank r takes positions r, r + N, r + 2N, ... Pure: no torch.
"""

from __future__ import annotations

import random

__all__ = ["round_robin", "permutation"]


def permutation(n_items: int, epoch: int, seed: int) -> list[int]:
    """The order of this epoch, identical on every rank and on every Python version."""
    order = list(range(n_items))
    # random.Random(int) seeding and shuffle are stable across CPython versions and platforms.
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def round_robin(n_items: int, rank: int, world_size: int, epoch: int, seed: int,
                shuffle: bool = True) -> list[int]:
    """Indices this rank processes in `epoch`; all ranks get n_items // world_size of them."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size}; expected >= 1. HINT: pass DistEnv.world_size")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} outside 0..{world_size - 1}. HINT: pass DistEnv.rank")
    if n_items < 0:
        raise ValueError(f"n_items={n_items}; expected >= 0")
    per_rank = n_items // world_size
    if per_rank == 0 and n_items:
        raise ValueError(
            f"{n_items} items cannot feed {world_size} ranks: every rank would get none. "
            "HINT: use fewer ranks or more items"
        )
    order = permutation(n_items, epoch, seed) if shuffle else list(range(n_items))
    kept = order[: per_rank * world_size]  # drop the tail so ranks do equal work
    return kept[rank::world_size]
