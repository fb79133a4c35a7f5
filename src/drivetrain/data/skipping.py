"""Starting a loader some batches in: ``SkipBatchSampler`` and ``SkipDataLoader`` (Accelerate's names).

``skip_first_batches`` (:mod:`drivetrain.data.prepare`) is the usual way in; these are its parts,
public because programs build them directly. Skipping at the batch sampler hands out the later
batches' indices only, so the skipped samples are never loaded; ``SkipDataLoader`` loads and drops
them, which works for any dataset (iterable ones too).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from torch.utils.data import BatchSampler, DataLoader


def _check_skip(skip_batches: Any) -> int:
    if isinstance(skip_batches, bool) or not isinstance(skip_batches, int) or skip_batches < 0:
        raise ValueError(f"skip_batches must be an int >= 0, got {skip_batches!r}.")
    return skip_batches


class SkipBatchSampler(BatchSampler):
    """The batches of ``batch_sampler`` after its first ``skip_batches``.

    Args:
        batch_sampler: any batch sampler (an iterable of lists of indices).
        skip_batches: how many batches to leave out at the start of every iteration.
    """

    def __init__(self, batch_sampler: Any, skip_batches: int = 0) -> None:
        # BatchSampler's own __init__ wants a sampler and a batch size; this wraps a batch sampler.
        self.batch_sampler = batch_sampler
        self.skip_batches = _check_skip(skip_batches)
        self.batch_size = getattr(batch_sampler, "batch_size", None)  # type: ignore[assignment]
        self.drop_last = getattr(batch_sampler, "drop_last", False)
        self.sampler = getattr(batch_sampler, "sampler", None)  # type: ignore[assignment]

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.batch_sampler), self.skip_batches, None)

    @property
    def total_length(self) -> int:
        """The wrapped batch sampler's length, skipped batches included."""
        return len(self.batch_sampler)

    def __len__(self) -> int:
        return max(0, len(self.batch_sampler) - self.skip_batches)


class SkipDataLoader(DataLoader):
    """A ``DataLoader`` whose iterations start ``skip_batches`` batches in (the skipped ones are loaded).

    Args:
        dataset: the data set.
        skip_batches: how many batches to drop at the start of every iteration.
        **kwargs: ``DataLoader``'s other arguments.
    """

    def __init__(self, dataset: Any, skip_batches: int = 0, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.skip_batches = _check_skip(skip_batches)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return itertools.islice(super().__iter__(), self.skip_batches, None)

    def __len__(self) -> int:
        return max(0, super().__len__() - self.skip_batches)
