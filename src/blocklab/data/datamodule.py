"""Lightning DataModule: resumable, rank-aware batches of examples, collated by the family's
objective.

Batch ``b`` of a run always holds the same examples: under ``W`` ranks, rank ``r`` takes
examples ``[(b·W + r)·B, (b·W + r + 1)·B)``. Resuming only needs the number of batches already
consumed (saved in the checkpoint), so it is exact mid-epoch and under DDP, without replaying
the epoch start as a plain DataLoader would. The DataLoader gets its own ``torch.Generator``
so it never draws from the global RNG (which dropout uses).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from blocklab.data.synthetic import Example


class ExampleSource(Dataset):
    """Map-style view of a generator ``make(index, step) -> Example``."""

    def __init__(self, make: Callable[[int, int | None], Example]) -> None:
        self.make = make

    def __getitem__(self, key: tuple[int, int | None]) -> Example:
        return self.make(*key)


class ResumableBatches(Sampler[list[tuple[int, int]]]):
    """Batches of (example index, optimizer step) from ``start`` on, for one rank."""

    def __init__(self, batch_size: int, *, start: int = 0, stop: int | None = None,
                 rank: int = 0, world: int = 1, accumulate: int = 1) -> None:
        self.batch_size, self.start, self.stop = batch_size, start, stop
        self.rank, self.world, self.accumulate = rank, world, accumulate

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        b = self.start
        while self.stop is None or b < self.stop:
            first = (b * self.world + self.rank) * self.batch_size
            step = b // self.accumulate
            yield [(first + i, step) for i in range(self.batch_size)]
            b += 1

    def __len__(self) -> int:
        if self.stop is None:
            raise TypeError("an endless sampler has no length")
        return max(self.stop - self.start, 0)


class BlocklabData(L.LightningDataModule):
    """Train batches are endless (the trainer stops at ``max_steps``); validation is a fixed
    set of ``val_batches`` batches from a disjoint stream (:meth:`validation_loader`)."""

    def __init__(self, train: Callable[[int, int | None], Example],
                 val: Callable[[int, int | None], Example], collate: Callable, *,
                 batch_size: int, val_batches: int, accumulate: int = 1,
                 num_workers: int = 0) -> None:
        super().__init__()
        self.train_make, self.val_make, self.collate = train, val, collate
        self.batch_size, self.val_batches = batch_size, val_batches
        self.accumulate, self.num_workers = accumulate, num_workers
        self.start_batch = 0  # set from the checkpoint before fit() on resume

    def _world(self) -> tuple[int, int]:
        t = self.trainer
        return (t.global_rank, t.world_size) if t is not None else (0, 1)

    def _loader(self, make: Callable, sampler: ResumableBatches) -> DataLoader:
        return DataLoader(ExampleSource(make), batch_sampler=sampler, collate_fn=self.collate,
                          num_workers=self.num_workers, generator=torch.Generator(),
                          persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        rank, world = self._world()
        return self._loader(self.train_make, ResumableBatches(
            self.batch_size, start=self.start_batch, rank=rank, world=world,
            accumulate=self.accumulate))

    def validation_loader(self) -> DataLoader:
        """The fixed validation batches of this rank. Not Lightning's ``val_dataloader``:
        blocklab validates inside the step (train/metrics.py), before the step's checkpoint."""
        rank, world = self._world()
        return self._loader(self.val_make, ResumableBatches(
            self.batch_size, stop=self.val_batches, rank=rank, world=world))
