"""Sharding an iterable dataset item by item, for loaders that do not dispatch from rank 0.

Every process iterates the whole dataset and keeps its slice of each chunk of
``num_processes * batch_size`` items, so each process sees ``batch_size`` new items per step.
The default for iterable data is dispatching instead (see :mod:`drivetrain.data.dispatch`),
which reads the data once, on rank 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset


class IterableDatasetShard(IterableDataset):
    """This process's items of ``dataset``, chunk by chunk.

    Args:
        dataset: the iterable dataset to share.
        batch_size: the items each process takes from each chunk.
        num_processes: how many processes share the dataset.
        process_index: which of them this is.
        drop_last: drop an incomplete final chunk instead of completing it with repeated items
            from the start of the epoch.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        num_processes: int,
        process_index: int,
        *,
        drop_last: bool = False,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_processes = num_processes
        self.process_index = process_index
        self.drop_last = drop_last
        #: Repeated items in the final chunk of the latest iteration (0: none).
        self.padding = 0

    def set_epoch(self, epoch: int) -> None:
        """Forward the epoch to the wrapped dataset if it is epoch-aware."""
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        self.padding = 0
        chunk = self.batch_size * self.num_processes
        start, stop = self.process_index * self.batch_size, (self.process_index + 1) * self.batch_size
        first: list[Any] = []
        buffer: list[Any] = []
        for item in self.dataset:
            buffer.append(item)
            if len(first) < chunk:
                first.append(item)
            if len(buffer) == chunk:
                yield from buffer[start:stop]
                buffer = []
        if not buffer or self.drop_last:
            return
        self.padding = chunk - len(buffer)
        buffer += [first[i % len(first)] for i in range(self.padding)]
        yield from buffer[start:stop]
