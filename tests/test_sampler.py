"""hpc.sampler: a loader stopped anywhere and resumed from its state yields the uninterrupted batches."""

import itertools

import pytest
import torch

from hpc.sampler import ResumableLoader, ResumableSampler

N, BATCH, WORLD = 42, 4, 2  # 21 samples per rank, 5 full batches per epoch (drop_last)


def _loader(rank, num_workers=0, drop_last=True):
    data = torch.arange(N)
    sampler = ResumableSampler(data, num_replicas=WORLD, rank=rank, shuffle=True, seed=7,
                               drop_last=drop_last)
    return ResumableLoader(data, sampler, batch_size=BATCH, drop_last=drop_last,
                           num_workers=num_workers)


def _take(batches, n):
    return [b.tolist() for b in itertools.islice(batches, n)]


@pytest.mark.parametrize("stop_after", [1, 3, 5, 6, 11])  # mid-epoch, at the end, in epoch 2 and 3
@pytest.mark.parametrize("rank", [0, 1])
def test_stop_and_resume_yields_the_uninterrupted_batches(stop_after, rank):
    clean = _take(_loader(rank).batches(), 15)
    first = _loader(rank)
    head = _take(first.batches(), stop_after)
    state = first.state_dict()
    resumed = _loader(rank)
    resumed.load_state_dict(state)
    assert head + _take(resumed.batches(), 15 - stop_after) == clean
    assert len({tuple(b) for b in clean[:5]}) == 5 and clean[:5] != clean[5:10]  # reshuffled


def test_position_counts_what_left_the_loader_not_what_workers_prefetched():
    clean = _take(_loader(0).batches(), 8)
    first = _loader(0, num_workers=1)
    head = _take(iter(first), 2)  # the worker has fetched further ahead by now
    assert first.state_dict() == {"epoch": 0, "consumed": 2 * BATCH, "num_samples": 21}
    resumed = _loader(0, num_workers=1)
    resumed.load_state_dict(first.state_dict())
    assert head + _take(resumed.batches(), 6) == clean


def test_epoch_loop_with_set_epoch_continues_mid_epoch():
    """The usual `for epoch in ...: set_epoch(epoch); for batch in loader` loop resumes too."""
    def run(loader, epochs):
        out = []
        for epoch in range(loader.epoch, epochs):
            loader.set_epoch(epoch)
            out += [b.tolist() for b in loader]
        return out

    clean = run(_loader(1), 3)
    first = _loader(1)
    first.set_epoch(0)
    head = _take(iter(first), 1)
    first.set_epoch(1)  # another epoch: position back to its start
    head += _take(iter(first), 2)
    resumed = _loader(1)
    resumed.load_state_dict(first.state_dict())
    assert head + run(resumed, 3) == clean[:1] + clean[5:]


def test_partial_last_batch_and_finished_epoch_state():
    loader = _loader(0, drop_last=False)
    batches = [b.tolist() for b in loader]
    assert [len(b) for b in batches] == [4, 4, 4, 4, 4, 1]
    assert loader.state_dict() == {"epoch": 1, "consumed": 0, "num_samples": 21}
    assert [b.tolist() for b in loader] == batches  # iterating the same epoch again restarts it


def test_position_of_another_world_size_is_refused():
    other = ResumableSampler(torch.arange(N), num_replicas=3, rank=0, seed=7)
    state = ResumableLoader(torch.arange(N), other, batch_size=BATCH).state_dict()
    with pytest.raises(ValueError, match="14 samples.*21.*HINT"):
        _loader(0).load_state_dict(state)
