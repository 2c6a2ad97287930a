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


def _mapped_in_child(address: int) -> bool:
    """Whether `address` is mapped in a freshly forked child (read from its /proc/self/maps)."""
    import os

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child only reads its own map and exits: it never touches the address
        os.close(read)
        spans = [line.split()[0].split("-") for line in open("/proc/self/maps")]
        os.write(write, b"1" if any(int(a, 16) <= address < int(b, 16) for a, b in spans) else b"0")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    os.close(read)
    return answer == b"1"


def test_dcp_staging_buffers_stay_out_of_forks():
    """A fork write-protects every page of the process; DCP's kept buffers are read by no other
    process, so they are left out of forks and the next copy into them takes no page faults.
    The store's own buffers must stay in: its forked writer reads them."""
    import mmap

    import pytest
    import torch

    from hpc.checkpoint.replicas import ShareStager
    from hpc.checkpoint.staging import Staging

    if not hasattr(mmap, "MADV_DONTFORK"):
        pytest.skip("MADV_DONTFORK is Linux's")
    state = {"w": torch.arange(3 * 2**20, dtype=torch.float32).reshape(3, 2**20),
             "flags": torch.tensor([True, False]), "step": torch.tensor(7)}
    staged = ShareStager(pinned=False).stage(state)
    for key, live in state.items():
        assert torch.equal(staged[key], live) and staged[key].data_ptr() != live.data_ptr()
        assert staged[key].dtype == live.dtype and staged[key].shape == live.shape
    assert not _mapped_in_child(staged["w"].data_ptr() + 2**20)
    assert _mapped_in_child(state["w"].data_ptr() + 2**20)
    kept = Staging().stage(state, cpu_too=True)
    assert _mapped_in_child(kept["w"].data_ptr() + 2**20)
