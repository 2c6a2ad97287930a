"""hpc.runtime.sampler: a loader stopped anywhere and resumed from its state yields the uninterrupted batches."""

import itertools

import pytest
import torch

from hpc.runtime.sampler import ResumableLoader, ResumableSampler

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
    assert first.state_dict() == {"epoch": 0, "samples": 2 * BATCH * WORLD, "dataset": N}
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
    assert loader.state_dict() == {"epoch": 1, "samples": 0, "dataset": N}
    assert [b.tolist() for b in loader] == batches  # iterating the same epoch again restarts it


def test_position_of_another_dataset_is_refused():
    state = _loader(0).state_dict() | {"dataset": N + 1}
    with pytest.raises(ValueError, match="43 samples per epoch.*42.*HINT"):
        _loader(0).load_state_dict(state)


def test_per_rank_position_of_the_same_world_size_still_loads():
    first = _loader(1)
    head = _take(first.batches(), 3)
    resumed = _loader(1)
    resumed.load_state_dict({"epoch": 0, "consumed": 3 * BATCH, "num_samples": N // WORLD})
    assert head + _take(resumed.batches(), 2) == _take(_loader(1).batches(), 5)
    with pytest.raises(ValueError, match="14 samples.*21.*HINT"):
        _loader(0).load_state_dict({"epoch": 0, "consumed": 4, "num_samples": 14})


def _global_steps(world, batches_per_rank, state=None, steps=6):
    """Per global step, the samples all ranks together took (a set: ranks split it any way)."""
    loaders = [_loader_of(world, r, batches_per_rank) for r in range(world)]
    for loader in loaders:
        loader.load_state_dict(state) if state else None
    streams = [loader.batches() for loader in loaders]
    return [sorted(x for s in streams for x in next(s).tolist()) for _ in range(steps)], \
        loaders[0].state_dict()


def _loader_of(world, rank, batch):
    data = torch.arange(N)
    sampler = ResumableSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=7)
    return ResumableLoader(data, sampler, batch_size=batch, drop_last=True)


@pytest.mark.parametrize("before, after", [(2, 1), (1, 2), (2, 3), (3, 2)])
def test_a_resume_on_another_world_size_neither_skips_nor_repeats(before, after):
    global_batch = 6  # the same global batch: per-rank batch = 6 / world size
    clean, _ = _global_steps(before, global_batch // before, steps=6)
    head, state = _global_steps(before, global_batch // before, steps=4)  # 24 of the 42
    tail, _ = _global_steps(after, global_batch // after, state=state, steps=2)
    assert head + tail == clean
    assert len({x for step in clean for x in step}) == 36  # no repeat inside the epoch
