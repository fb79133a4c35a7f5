"""Batches the data layer cannot prepare, passed through with the prepared loaders' interface.

A front door may be given something other than a plain ``DataLoader``: a list of batches, any
iterable, or a ``DataLoader`` subclass with its own iteration (which a prepared loader would
lose). :class:`PassThroughBatches` iterates it as it is — not sharded — and adds what the loops
use of a :class:`~drivetrain.data.PreparedDataLoader`: batches placed on the device, ``set_epoch``
for epoch-aware samplers, a start position for resuming (by reading and dropping batches, as
there are no indices to skip), ``state_dict``/``load_state_dict`` of that position, and results
merged across processes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from drivetrain.data.loader import check_batch_count, check_epoch


class PassThroughBatches:
    """``batches`` iterated as they are; see the module docstring.

    Args:
        batches: any iterable of batches.
        place: puts a batch on the device (``None``: the batches are where they should be).
    """

    def __init__(self, batches: Any, place: Callable[[Any], Any] | None) -> None:
        #: What was passed through.
        self.batches = batches
        self._place = place
        self._epoch = 0
        self._resume_at: int | None = None

    def __iter__(self) -> Iterator[Any]:
        skip, self._resume_at = self._resume_at or 0, None
        iterator = iter(self.batches)
        if skip:
            for _ in itertools.islice(iterator, skip):
                pass
        if self._place is None:
            return iterator  # nothing added per batch
        return map(self._place, iterator)

    def __len__(self) -> int:
        return len(self.batches)

    def __getattr__(self, name: str) -> Any:
        if name == "batches":  # not set yet (unpickling): do not recurse
            raise AttributeError(name)
        return getattr(self.batches, name)

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Tell the epoch to the epoch-aware parts of the batches (a ``DistributedSampler``, say)."""
        self._epoch = check_epoch(epoch)
        batch_sampler = getattr(self.batches, "batch_sampler", None)
        targets: list[Any] = []
        for candidate in (
            getattr(self.batches, "sampler", None),
            getattr(batch_sampler, "sampler", None),
            batch_sampler,
            getattr(self.batches, "dataset", None),
            self.batches,
        ):
            if candidate is not None and all(candidate is not seen for seen in targets):
                targets.append(candidate)
                set_epoch = getattr(candidate, "set_epoch", None)
                if callable(set_epoch):
                    set_epoch(epoch)

    def start_next_epoch_at(self, batch: int) -> None:
        """Make the next iteration begin with the ``batch``-th batch (0-based), once."""
        self._resume_at = check_batch_count(batch)

    @property
    def next_epoch_start(self) -> int:
        """The batch the next iteration begins with."""
        return self._resume_at or 0

    def state_dict(self) -> dict[str, Any]:
        """The epoch (the position within it is the caller's to count: nothing is counted per batch)."""
        return {"epoch": self._epoch, "in_epoch": False, "batches_yielded": 0, "batches_per_step": 1}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at ``state``'s position (``in_epoch``, ``batches_yielded``) at the next iteration."""
        self._epoch = int(state["epoch"])
        self._resume_at = int(state["batches_yielded"]) if state.get("in_epoch") else None

    def merge_process_results(self, per_process: Sequence[Sequence[Any]]) -> list[Any]:
        """Every process's per-batch results, process after process (nothing was shared out)."""
        return [result for results in per_process for result in results]
