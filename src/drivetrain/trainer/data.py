"""The data connection: which loaders a stage uses, sharded across processes, limited, resumable.

Loaders come from the ``fit``/``validate``/… arguments, a :class:`DataModule`, or the module's
own ``*_dataloader`` methods. In a multi-process run the Trainer shards them itself (unless
``use_distributed_sampler=False``): training loaders get a ``DistributedSampler`` (equal
shares, so the ranks step together); evaluation and prediction loaders get contiguous,
unpadded shares, so no sample is seen twice and rank 0's outputs followed by rank 1's … are in
dataset order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from drivetrain.trainer.state import RunningStage


class ContiguousShardSampler(Sampler[int]):
    """Indices ``[start, end)`` of this rank's contiguous share of ``range(length)``, without padding."""

    def __init__(self, length: int, num_replicas: int, rank: int) -> None:
        share, extra = divmod(length, num_replicas)
        self.start = rank * share + min(rank, extra)
        self.end = self.start + share + (1 if rank < extra else 0)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end))

    def __len__(self) -> int:
        return self.end - self.start


class SkipBatchSampler(Sampler[list[int]]):
    """Yield the batches of ``inner`` after the first ``skip`` (indices only: no data is loaded for them).

    ``after_skip`` runs once the skipped index batches were drawn; the Trainer uses it to put the
    random generators back to where the checkpoint left them.
    """

    def __init__(self, inner: Iterable[list[int]], skip: int, after_skip: Callable[[], None]) -> None:
        self.inner = inner
        self.skip = skip
        self.after_skip = after_skip

    def __iter__(self) -> Iterator[list[int]]:
        iterator = iter(self.inner)
        for _ in range(self.skip):
            if next(iterator, None) is None:
                break
        self.after_skip()
        yield from iterator

    def __len__(self) -> int:
        return max(0, len(self.inner) - self.skip)  # type: ignore[arg-type]


def is_loader_list(value: Any) -> bool:
    """Whether ``value`` is several loaders (rather than one iterable of batches)."""
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, DataLoader) for v in value)


def as_loader_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if is_loader_list(value) else [value]


def rebuildable(loader: Any) -> bool:
    """Whether the Trainer can rebuild ``loader`` with another sampler (a DataLoader without its own ``__init__``)."""
    return isinstance(loader, DataLoader) and type(loader).__init__ is DataLoader.__init__


def rebuild(loader: DataLoader, **changes: Any) -> DataLoader:
    """A copy of ``loader`` with ``changes`` (``sampler=`` or ``batch_sampler=``)."""
    kwargs: dict[str, Any] = {
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": loader.persistent_workers,
        "pin_memory_device": loader.pin_memory_device,
    }
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    if "batch_sampler" in changes:
        kwargs["batch_sampler"] = changes["batch_sampler"]
    else:
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last, sampler=changes["sampler"])
    return type(loader)(loader.dataset, **kwargs)


def _plain_batching(loader: DataLoader) -> bool:
    return type(loader.batch_sampler) is BatchSampler or loader.batch_sampler is None


def shard(loader: Any, stage: RunningStage, sampler_kwargs: dict[str, int], seed: int) -> Any:
    """Give ``loader`` this rank's share of the data (see the module docstring)."""
    if not isinstance(loader, DataLoader) or _is_iterable_dataset(loader):
        return loader  # an iterable of batches, or a stream: it shards itself
    if isinstance(loader.sampler, DistributedSampler):
        return loader  # sharded by the user already
    where = f"the {stage.dataloader_prefix} dataloader"
    if not rebuildable(loader):
        raise TypeError(
            f"{where} is a {type(loader).__name__}, a DataLoader subclass with its own __init__, which the Trainer "
            f"cannot rebuild with a distributed sampler. Give it a DistributedSampler yourself and pass "
            f"Trainer(use_distributed_sampler=False)."
        )
    if not isinstance(loader.sampler, (SequentialSampler, RandomSampler)) or not _plain_batching(loader):
        custom = (
            loader.sampler
            if not isinstance(loader.sampler, (SequentialSampler, RandomSampler))
            else loader.batch_sampler
        )
        raise TypeError(
            f"{where} uses the custom {type(custom).__name__}, which the Trainer cannot split between "
            f"{sampler_kwargs['num_replicas']} processes. Make it yield this process's share (rank "
            f"{sampler_kwargs['rank']} of {sampler_kwargs['num_replicas']}) and pass Trainer(use_distributed_sampler=False)."
        )
    if stage == RunningStage.TRAINING:
        sampler: Sampler[int] = DistributedSampler(
            loader.dataset,
            num_replicas=sampler_kwargs["num_replicas"],
            rank=sampler_kwargs["rank"],
            shuffle=isinstance(loader.sampler, RandomSampler),
            seed=seed,
        )
    else:
        sampler = ContiguousShardSampler(len(loader.dataset), **sampler_kwargs)  # type: ignore[arg-type]
    return rebuild(loader, sampler=sampler)


def _is_iterable_dataset(loader: DataLoader) -> bool:
    from torch.utils.data import IterableDataset

    return isinstance(loader.dataset, IterableDataset)


def loader_length(loader: Any) -> float:
    """``len(loader)``, or infinity for loaders without a length."""
    try:
        return float(len(loader))
    except TypeError:
        return math.inf


def limited_length(loader: Any, limit: int | float, name: str) -> float:
    """How many batches of ``loader`` a stage uses under ``limit`` (a count or a fraction)."""
    length = loader_length(loader)
    if isinstance(limit, int):
        return float(min(limit, length))
    if limit == 1.0:
        return length
    if math.isinf(length):
        raise ValueError(
            f"{name}={limit} is a fraction, but the loader has no length (an iterable dataset). Pass a number of "
            f"batches instead ({name}=100), or 1.0 for all of it."
        )
    return float(int(length * limit))


def set_sampler_epoch(loader: Any, epoch: int) -> None:
    """Tell the loader's samplers which epoch starts (DistributedSampler reshuffles by epoch)."""
    for holder in (
        getattr(loader, "sampler", None),
        getattr(getattr(loader, "batch_sampler", None), "sampler", None),
    ):
        set_epoch = getattr(holder, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)


def resumed_iterator(loader: Any, skip: int, after_skip: Callable[[], None]) -> Iterator[Any]:
    """An iterator over ``loader`` that starts after its first ``skip`` batches.

    Plain DataLoaders are rebuilt with a :class:`SkipBatchSampler`, which skips index batches
    without loading them; other iterables are advanced batch by batch.
    """
    if rebuildable(loader) and not _is_iterable_dataset(loader) and loader.batch_sampler is not None:
        return iter(rebuild(loader, batch_sampler=SkipBatchSampler(loader.batch_sampler, skip, after_skip)))
    iterator = iter(loader)
    for _ in range(skip):
        if next(iterator, _END) is _END:
            break
    after_skip()
    return iterator


_END = object()


def check_limit(name: str, value: Any) -> int | float:
    """Validate a ``limit_*_batches`` value: an int >= 0 or a float in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{name} expects an int (batches) or a float (fraction of the loader), got {value!r}."
        )
    if isinstance(value, float) and not 0.0 <= value <= 1.0:
        raise ValueError(
            f"{name}={value} is a fraction outside [0, 1]; use a float in [0, 1] or an int number of batches."
        )
    if isinstance(value, int) and value < 0:
        raise ValueError(f"{name}={value} is negative; use 0 (skip this stage) or more batches.")
    return value


def names_of(loaders: Sequence[Any]) -> list[str]:
    return [type(loader).__name__ for loader in loaders]
