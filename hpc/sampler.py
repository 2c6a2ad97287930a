"""Distributed data loading that resumes mid-epoch: the sampler position is checkpointed state.

    loader = s.loader(dataset, batch_size=32, seed=0)               # a ResumableLoader
    loop.resume({"model": model, "optimizer": opt, "data": loader})  # per-rank state, see below
    batches = loader.batches()                                      # endless, epoch after epoch
    for step in loop.steps(total):
        x, y = next(batches)

The state is (epoch, samples of this epoch already handed to the training loop). Counting happens
where batches leave the loader, not in the sampler: DataLoader workers prefetch indices ahead of
training, so the sampler's own count would run ahead of what was trained on. On resume the
sampler rebuilds the epoch's permutation (seed + epoch, as DistributedSampler does) and skips what
was consumed, so the resumed run sees exactly the batches the uninterrupted one would have seen.
TrainLoop stores objects with ``per_rank_state = True`` in each rank's own checkpoint file.

The loader never draws from the global torch RNG, which belongs to the model (dropout) and to
augmentation in the main process, and which a resume restores exactly (hpc.rng). A plain
DataLoader draws one number from it each time it starts an iterator, and a resumed run starts one
mid-epoch where the uninterrupted run did not: every later dropout mask would differ. Here the
iterator draws from the loader's own generator, reseeded from (seed, epoch, rank) at each start,
so the seeds of DataLoader workers are also reproducible per epoch. Randomness drawn inside
workers (num_workers > 0) still depends on where in the epoch the workers started: for a bitwise
resume, augment in the main process or seed each sample's augmentation from its index.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, DistributedSampler


class ResumableSampler(DistributedSampler):
    """DistributedSampler whose next epoch can start after `start` of this rank's samples."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start = 0

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        return iter(indices[self.start:])

    def __len__(self) -> int:
        return self.num_samples - self.start


class ResumableLoader(DataLoader):
    """DataLoader over a ResumableSampler that counts the samples it has handed out."""

    per_rank_state = True  # each rank has its own position: saved in its own checkpoint file

    def __init__(self, dataset: Any, sampler: ResumableSampler, **kwargs: Any) -> None:
        if kwargs.get("generator") is not None:
            raise ValueError("ResumableLoader got generator=...; it seeds its own generator from "
                             "(seed, epoch, rank) so that a resume repeats it. HINT: pass seed= instead.")
        super().__init__(dataset, sampler=sampler, generator=torch.Generator(), **kwargs)
        self.consumed = 0  # samples of the current epoch yielded to the caller

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for `epoch`; setting the epoch it is already in keeps the position (so a
        resumed `for epoch in range(loader.epoch, n): s.set_epoch(epoch)` continues mid-epoch)."""
        if epoch != self.sampler.epoch:
            self.consumed = 0
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        total = self.sampler.num_samples
        if self.consumed >= total:  # iterating a finished epoch again restarts it, as DataLoader does
            self.consumed = 0
        self.sampler.start = self.consumed
        self.generator.manual_seed(_mix(self.sampler.seed, self.sampler.epoch, self.sampler.rank))
        for batch in super().__iter__():  # starting the iterator draws from self.generator only
            self.consumed = min(self.consumed + (self.batch_size or 1), total)
            yield batch
        # Exhausted: with drop_last a remainder smaller than a batch is never yielded, so the
        # count alone would leave the epoch unfinished forever.
        self.consumed, self.sampler.start = total, 0

    def batches(self) -> Iterator[Any]:
        """Batches forever: at the end of an epoch the next one starts, reshuffled."""
        while True:
            if self.consumed >= self.sampler.num_samples:
                self.set_epoch(self.epoch + 1)
            yield from self

    def state_dict(self) -> dict[str, int]:
        epoch, consumed = self.epoch, self.consumed
        if consumed >= self.sampler.num_samples:  # a finished epoch: resume at the next one
            epoch, consumed = epoch + 1, 0
        return {"epoch": epoch, "consumed": consumed, "num_samples": self.sampler.num_samples}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["num_samples"] != self.sampler.num_samples:
            raise ValueError(
                f"checkpointed loader had {state['num_samples']} samples per rank per epoch, this "
                f"one has {self.sampler.num_samples}. The position cannot carry over. HINT: resume "
                "with the same dataset, world size and drop_last, or start a fresh run directory.")
        self.sampler.set_epoch(state["epoch"])
        self.consumed = state["consumed"]


def _mix(*values: int) -> int:
    """A 63-bit seed from several integers, the same on every machine and Python version."""
    digest = hashlib.blake2b(":".join(map(str, values)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
