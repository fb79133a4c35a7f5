"""Dispatching: rank 0 loads each step's data and every process receives its slice.

The default for iterable data (which cannot be shared out by index), and an option for any
loader (``dispatch_batches=True``): only rank 0 reads the dataset. Each step rank 0 loads one
batch (``split_batches=True``) or ``num_processes`` batches joined together, broadcasts the
result, and each process keeps its equal slice. A final step whose item count the processes do
not divide is completed with items from the epoch's first step (``even_batches``), and
:attr:`~drivetrain.data.PreparedDataLoader.padding` says how many.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from drivetrain.data.batches import batch_length, concatenate_batches, pad_batch, slice_batch
from drivetrain.data.loader import PreparedDataLoader, data_parallel_share


class DispatchingDataLoader(PreparedDataLoader):
    """Rank 0 loads, every process gets a slice; see the module docstring.

    Built by :func:`~drivetrain.data.prepare_data_loader` with ``dispatch_batches=True`` (the
    default for iterable datasets).
    """

    def __init__(
        self,
        dataset: Any,
        *,
        split_batches: bool,
        even_batches: bool,
        full_batch_size: int | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, **kwargs)
        self._split = split_batches
        self._even = even_batches
        self._full_batch_size = full_batch_size
        self._dispatch_padding = 0

    def __len__(self) -> int:
        batches = len(self.base_dataloader)
        if self._split:
            return batches
        n = data_parallel_share(self._strategy)[0]
        return batches // n if self.drop_last else math.ceil(batches / n)

    def _final_padding(self) -> int:
        return self._dispatch_padding

    def _source(self, start_at: int) -> Iterator[Any]:
        strategy = self._strategy
        n, rank = data_parallel_share(strategy)
        per_step = 1 if self._split else n
        batches: Iterator[Any] | None = None
        if strategy.is_global_zero:
            index_sampler: Any = self.batch_sampler
            if start_at and hasattr(index_sampler, "start_at"):
                index_sampler.start_at = start_at * per_step
                batches = DataLoader.__iter__(self)
            else:
                batches = DataLoader.__iter__(self)
                for _ in itertools.islice(batches, start_at * per_step):
                    pass  # iterable data has no indices to skip: read and drop
        first: Any = None
        while True:
            message = self._next_step(batches, per_step) if batches is not None else None
            step = strategy.broadcast(message, src=0)
            if step is None:
                return  # the padding of the last step stays readable
            self._dispatch_padding = 0
            if first is None:
                first = step
            size = batch_length(step)
            share = math.ceil(size / n)
            if size % n and self._even:
                self._dispatch_padding = share * n - size
                step = pad_batch(step, first, self._dispatch_padding)
            yield slice_batch(step, rank * share, (rank + 1) * share)

    def _next_step(self, batches: Iterator[Any], per_step: int) -> Any:
        parts = list(itertools.islice(batches, per_step))
        if not parts:
            return None
        if self.drop_last:
            full = self._full_batch_size
            if len(parts) < per_step or (full is not None and batch_length(parts[-1]) < full):
                return None  # a step not every process can fill ends the epoch for all
        return concatenate_batches(parts)
