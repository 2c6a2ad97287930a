"""Distributed data loading that resumes mid-epoch: the sampler position is checkpointed state.

    loader = s.loader(dataset, batch_size=32, seed=0)               # a ResumableLoader
    loop.resume({"model": model, "optimizer": opt, "data": loader})  # per-rank state, see below
    batches = loader.batches()                                      # endless, epoch after epoch
    for step in loop.steps(total):
        x, y = next(batches)

The state is global: (epoch, samples of this epoch that all ranks together have handed to the
training loop). Counting happens where batches leave the loader, not in the sampler: DataLoader
workers prefetch indices ahead of training, so the sampler's own count would run ahead of what
was trained on. Every rank draws from one permutation per epoch (seed + epoch, as
DistributedSampler does): rank r of W takes positions r, r + W, ... of what is left of it. After G
samples the consumed ones are exactly the first G of the permutation, whatever the world size, so
a resume on another world size continues with position G, split over its own ranks: no sample is
skipped or repeated (with drop_last, only the epoch's last few that do not fill every rank differ).
Being the same on every rank, the state goes in the checkpoint's shared file.

The loader never draws from the global torch RNG, which belongs to the model (dropout) and to
augmentation in the main process, and which a resume restores exactly (hpc.runtime.rng). A plain
DataLoader draws one number from it each time it starts an iterator, and a resumed run starts one
mid-epoch where the uninterrupted run did not: every later dropout mask would differ. Here the
iterator draws from the loader's own generator, reseeded from (seed, epoch, rank) at each start,
so the seeds of DataLoader workers are also reproducible per epoch. Randomness drawn inside
workers (num_workers > 0) still depends on where in the epoch the workers started: for a bitwise
resume, augment in the main process or seed each sample's augmentation from its index.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, DistributedSampler

from hpc.runtime.rng import derive_seed


class ResumableSampler(DistributedSampler):
    """DistributedSampler whose next epoch can start after `start` samples of all ranks together.

    Starting at 0 it yields what DistributedSampler yields. Starting at G, rank r takes positions
    G + r, G + r + W, ... of the epoch's order, cut to an equal count per rank.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start = 0  # global: samples of this epoch's order that are already consumed

    def order(self) -> list[int]:
        """The epoch's order shared by all ranks: DistributedSampler's, before the split."""
        if self.shuffle:
            gen = torch.Generator()
            gen.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.dataset), generator=gen).tolist()
        else:
            order = list(range(len(self.dataset)))
        while len(order) < self.total_size:  # padded with its own head, as DistributedSampler
            order += order[:self.total_size - len(order)]
        return order[:self.total_size]

    def __iter__(self) -> Iterator[int]:
        return iter(self.order()[self.start + self.rank:self.start + len(self) * self.num_replicas:
                                 self.num_replicas])

    def __len__(self) -> int:
        return max(self.total_size - self.start, 0) // self.num_replicas


class ResumableLoader(DataLoader):
    """DataLoader over a ResumableSampler that counts the samples it has handed out."""

    per_rank_state = False  # the position is global, the same on every rank: one shared copy

    def __init__(self, dataset: Any, sampler: ResumableSampler, **kwargs: Any) -> None:
        if kwargs.get("generator") is not None:
            raise ValueError("ResumableLoader got generator=...; it seeds its own generator from "
                             "(seed, epoch, rank) so that a resume repeats it. HINT: pass seed= instead.")
        super().__init__(dataset, sampler=sampler, generator=torch.Generator(), **kwargs)
        self.consumed = 0  # samples of the current epoch yielded to the caller, by all ranks

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
        total, ranks = self.sampler.total_size, self.sampler.num_replicas
        if self.consumed >= total:  # iterating a finished epoch again restarts it, as DataLoader does
            self.consumed = 0
        self.sampler.start = self.consumed
        self.generator.manual_seed(derive_seed(self.sampler.seed, self.sampler.epoch, self.sampler.rank))
        for batch in super().__iter__():  # starting the iterator draws from self.generator only
            self.consumed = min(self.consumed + (self.batch_size or 1) * ranks, total)
            yield batch
        # Exhausted: with drop_last a remainder smaller than a batch is never yielded, so the
        # count alone would leave the epoch unfinished forever.
        self.consumed, self.sampler.start = total, 0

    def batches(self) -> Iterator[Any]:
        """Batches forever: at the end of an epoch the next one starts, reshuffled."""
        while True:
            if self.consumed >= self.sampler.total_size:
                self.set_epoch(self.epoch + 1)
            yield from self

    def state_dict(self) -> dict[str, int]:
        epoch, consumed = self.epoch, self.consumed
        if consumed >= self.sampler.total_size:  # a finished epoch: resume at the next one
            epoch, consumed = epoch + 1, 0
        return {"epoch": epoch, "samples": consumed, "dataset": len(self.sampler.dataset)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue at the saved global position, on this world size or another one."""
        if "samples" not in state:  # per rank, as written before the position was global
            if state["num_samples"] != self.sampler.num_samples:
                raise ValueError(
                    f"checkpointed loader had {state['num_samples']} samples per rank per epoch, this "
                    f"one has {self.sampler.num_samples}: a per-rank position of another world size "
                    "cannot carry over. HINT: resume on the world size that wrote it once; its "
                    "next checkpoints hold a global position that any world size can resume.")
            state = {"epoch": state["epoch"], "dataset": len(self.sampler.dataset),
                     "samples": state["consumed"] * self.sampler.num_replicas}
        if state["dataset"] != len(self.sampler.dataset):
            raise ValueError(
                f"checkpointed loader drew from {state['dataset']} samples per epoch, this one "
                f"from {len(self.sampler.dataset)}. The position cannot carry over. HINT: resume "
                "with the same dataset, or start a fresh run directory.")
        self.sampler.set_epoch(state["epoch"])
        self.consumed = state["samples"]
