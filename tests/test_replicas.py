"""hpc.checkpoint.replicas.split: every rank computes the same split on its own; it balances."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hpc.checkpoint.replicas import split


@given(st.lists(st.integers(0, 10**9), max_size=60), st.integers(1, 16))
def test_split_gives_each_tensor_one_rank_and_balances_within_the_largest(sizes, world):
    owners = split(sizes, world)
    assert owners == split(list(sizes), world)  # deterministic: no rank needs to ask another
    assert len(owners) == len(sizes) and all(0 <= o < world for o in owners)
    load = [sum(max(s, 1) for s, o in zip(sizes, owners) if o == r) for r in range(world)]
    # greedy to the least loaded: no rank ends more than one tensor above another
    assert max(load) - min(load) <= max([max(s, 1) for s in sizes], default=0)


@given(st.lists(st.integers(0, 10**9), max_size=60), st.integers(1, 16))
def test_split_gives_each_tensor_to_the_least_loaded_rank_the_lowest_of_equals(sizes, world):
    load, expected = [0] * world, []
    for size in sizes:  # the rule, scanned rank by rank
        rank = min(range(world), key=lambda r: (load[r], r))
        expected.append(rank)
        load[rank] += max(size, 1)
    assert split(sizes, world) == expected


def test_equal_sizes_go_round_robin():
    assert split([4, 4, 4, 4, 4], 2) == [0, 1, 0, 1, 0]
