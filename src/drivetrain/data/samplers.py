"""Sharding at the batch-sampler level: each process takes its share of another sampler's batches.

Working on batches of indices (never on data) keeps any sampler or batch sampler a user wrote,
makes skipping already-seen batches on resume free, and lets every process compute the same
schedule without talking to the others. Two ways to share a batch stream across ``N`` processes:

* whole batches (``split_batches=False``): batch ``i`` goes to process ``i % N``; each step of the
  job consumes ``N`` batches (a *round*);
* split batches (``split_batches=True``): every batch is cut into ``N`` equal slices; each step
  consumes one batch.

With ``even_batches=True`` an incomplete final round is completed with indices from the start of
the epoch, so every process gets the same number of equally sized batches; :attr:`padding` then
says how many of the items in that round are such repeats, so metrics can drop them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from typing import Any

from torch.utils.data import Sampler


class ShardedBatchSampler(Sampler[list[int]]):
    """This process's batches out of ``batch_sampler``'s.

    Args:
        batch_sampler: the batch sampler to share (a ``BatchSampler`` or any iterable of index lists).
        num_processes: how many processes share it.
        process_index: which of them this is.
        split_batches: cut each batch into ``num_processes`` slices instead of dealing whole batches.
        even_batches: complete the final round with repeated indices so all processes get the same
            number of batches of the same size.

    Raises:
        ValueError: ``split_batches`` with a batch size that ``num_processes`` does not divide, or
            with a batch sampler that has no fixed batch size.
    """

    def __init__(
        self,
        batch_sampler: Iterable[Any],
        num_processes: int = 1,
        process_index: int = 0,
        *,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        if not 0 <= process_index < num_processes:
            raise ValueError(f"process_index={process_index} is outside 0..{num_processes - 1}.")
        batch_size = getattr(batch_sampler, "batch_size", None)
        if split_batches and num_processes > 1:
            if batch_size is None:
                raise ValueError(
                    f"split_batches=True needs a batch sampler with a fixed batch_size to split, but "
                    f"{type(batch_sampler).__name__} has none. Use split_batches=False, or give the "
                    f"batch sampler a batch_size attribute."
                )
            if batch_size % num_processes:
                raise ValueError(
                    f"split_batches=True cuts each batch of {batch_size} into {num_processes} equal parts, "
                    f"which is impossible. Use a batch size that is a multiple of {num_processes} "
                    f"(e.g. {math.ceil(batch_size / num_processes) * num_processes}), or split_batches=False."
                )
        self.batch_sampler = batch_sampler
        self.batch_size: int | None = batch_size
        self.drop_last: bool = bool(getattr(batch_sampler, "drop_last", False))
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        #: This process's batches to skip at the start of the next iteration only (resuming).
        self.start_at = 0
        #: Repeated items at the end of the final round of the latest iteration (0: none).
        self.padding = 0

    @property
    def sampler(self) -> Any:
        """The index sampler inside the wrapped batch sampler (``None`` if it has none)."""
        return getattr(self.batch_sampler, "sampler", None)

    @property
    def per_process_batch_size(self) -> int | None:
        if self.batch_size is None:
            return None
        return self.batch_size // self.num_processes if self.split_batches else self.batch_size

    def __len__(self) -> int:
        return self._length(self.process_index)

    def batches_per_process(self) -> list[int]:
        """How many batches each process gets in an epoch (they differ only with ``even_batches=False``)."""
        return [self._length(rank) for rank in range(self.num_processes)]

    def _length(self, rank: int) -> int:
        batches = len(self.batch_sampler)  # type: ignore[arg-type]
        n = self.num_processes
        if n == 1:
            return batches
        if self.split_batches:
            if self.even_batches or self.drop_last:
                return batches
            last = _last_batch_size(self.batch_sampler)
            part = self.batch_size // n if self.batch_size else 0
            return batches - 1 if last and rank * part >= last else batches
        if self.drop_last:
            return batches // n
        if self.even_batches:
            return math.ceil(batches / n)
        return batches // n + (1 if rank < batches % n else 0)

    def __iter__(self) -> Iterator[Any]:
        if self.num_processes == 1 and not self.start_at:
            return iter(self.batch_sampler)  # nothing to share or skip: no extra layer per batch
        return self._batches()

    def _batches(self) -> Iterator[Any]:
        # Settled at the first batch, not in __iter__: DataLoader's worker iterator calls
        # iter() twice and uses only the second iterator.
        skip, self.start_at = self.start_at, 0
        self.padding = 0
        if self.num_processes == 1:
            yield from itertools.islice(iter(self.batch_sampler), skip, None)
        elif self.split_batches:
            yield from self._split(skip)
        else:
            yield from self._deal(skip)

    def _deal(self, skip: int) -> Iterator[Any]:
        n, rank, size = self.num_processes, self.process_index, self.batch_size
        pad = self.even_batches and not self.drop_last
        first: list[Any] = []  # the epoch's first indices (first batches when sizes vary), to pad from
        round_: list[Any] = []
        index = 0
        for batch in self.batch_sampler:
            if pad:
                if size is None and len(first) < n:
                    first.append(batch)
                elif size is not None and len(first) < n * size:
                    first.extend(batch)
            round_.append(batch)
            if len(round_) == n and (size is None or len(batch) == size):
                if index >= skip:
                    yield round_[rank]
                index += 1
                round_ = []
        if not round_ or self.drop_last:
            return  # a round not every process can take part in ends the epoch for all
        if not self.even_batches:
            if rank < len(round_) and index >= skip:
                yield round_[rank]
            return
        if size is None:
            real = sum(len(batch) for batch in round_)
            for repeat in range(n - len(round_)):
                round_.append(first[repeat % len(first)])
            self.padding = sum(len(batch) for batch in round_) - real
        else:
            real = sum(len(batch) for batch in round_)
            flat = [i for batch in round_ for i in batch] + _cycle(first, n * size - real)
            round_ = [flat[k * size : (k + 1) * size] for k in range(n)]
            self.padding = n * size - real
        if index >= skip:
            yield round_[rank]

    def _split(self, skip: int) -> Iterator[Any]:
        n, rank = self.num_processes, self.process_index
        size = self.batch_size
        assert size is not None  # checked in __init__
        part = size // n
        first: list[Any] | None = None
        short: Any = None
        index = 0
        for batch in self.batch_sampler:
            if short is not None:
                raise ValueError(
                    f"split_batches=True needs every batch but the last to hold batch_size={size} indices; "
                    f"{type(self.batch_sampler).__name__} yielded one of {len(short)} before the end."
                )
            if first is None:
                first = list(batch)
            if len(batch) == size:
                if index >= skip:
                    yield batch[rank * part : (rank + 1) * part]
                index += 1
            else:
                short = batch
        if short is None or not len(short) or index < skip:
            return
        if self.even_batches:
            self.padding = size - len(short)
            padded = list(short) + _cycle(first or [], self.padding)
            yield padded[rank * part : (rank + 1) * part]
        elif len(short) > rank * part:
            yield short[rank * part : (rank + 1) * part]


def _cycle(items: list[Any], count: int) -> list[Any]:
    """The first ``count`` elements of ``items`` repeated end to end."""
    if count <= 0:
        return []
    if not items:
        raise ValueError("Cannot complete the final round: the epoch produced no indices to repeat.")
    return [items[i % len(items)] for i in range(count)]


def _last_batch_size(batch_sampler: Any) -> int:
    sampler = getattr(batch_sampler, "sampler", None)
    size = getattr(batch_sampler, "batch_size", None)
    try:
        total = len(sampler)  # type: ignore[arg-type]
    except TypeError:
        return 0
    return total % size if size else 0
