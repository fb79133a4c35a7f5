"""Turn a user's ``DataLoader`` into the one each process should iterate.

:func:`prepare_data_loader` is the one entry point both front doors use: it reads the number of
processes and this process's rank from the strategy, picks sharding or dispatching, and returns a
:class:`~drivetrain.data.PreparedDataLoader`.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterable, Iterator
from enum import Enum
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, Sampler

from drivetrain.data import rng
from drivetrain.data.batches import batch_mover
from drivetrain.data.dispatch import DispatchingDataLoader
from drivetrain.data.iterable import IterableDatasetShard
from drivetrain.data.loader import ActiveLoaders, PreparedDataLoader, ShardedDataLoader, loader_settings
from drivetrain.data.samplers import ShardedBatchSampler
from drivetrain.strategies.strategy import Strategy

_MAX_SEED = 2**63 - 1


def prepare_data_loader(
    dataloader: DataLoader,
    strategy: Strategy,
    *,
    split_batches: bool = False,
    even_batches: bool = True,
    dispatch_batches: bool | None = None,
    rng_types: Iterable[str | Enum] | None = None,
    device_placement: bool = True,
    data_seed: int | None = None,
    active_loaders: ActiveLoaders | None = None,
) -> PreparedDataLoader:
    """The loader this process should iterate in place of ``dataloader``.

    Args:
        dataloader: the user's loader; its dataset, sampler, batch sampler, collate function and
            worker settings are kept.
        strategy: says how many processes share the data (``distributed_sampler_kwargs``), does the
            broadcasts, and places batches on its device.
        split_batches: cut each batch into one slice per process (the batch size is then the
            global one) instead of giving each process whole batches.
        even_batches: complete a final step the processes cannot share evenly with items from the
            start of the epoch, so every process runs the same number of equal steps.
        dispatch_batches: rank 0 loads and broadcasts (``True``), or every process loads its own
            share (``False``); ``None`` dispatches iterable datasets only.
        rng_types: generators to copy from rank 0 at each epoch start, besides the sampler's
            own generator, which is always synchronised: ``"torch"``, and the device's generators
            (``"cuda"``, ``"xpu"``, ``"mps"``, ``"xla"``; through the accelerator's RNG hooks).
        device_placement: move batches to the strategy's device.
        data_seed: seed for the generator given to a shuffling sampler that has none (default:
            ``torch.initial_seed()``, so ``set_seed`` decides the order).
        active_loaders: where the loader registers itself while it is being iterated.

    Raises:
        TypeError: ``dataloader`` is not a ``DataLoader``.
        ValueError: settings that cannot work together (see the messages).
    """
    if isinstance(dataloader, PreparedDataLoader):
        return dataloader
    if not isinstance(dataloader, DataLoader):
        raise TypeError(
            f"prepare_data_loader expects a torch.utils.data.DataLoader, got {type(dataloader).__name__}. "
            f"Wrap your dataset in a DataLoader first."
        )
    names = tuple(dict.fromkeys(("generator", *rng.validate_rng_types(rng_types))))
    unused = rng.unused_device_types(strategy, names)
    if unused:
        warnings.warn(
            f"rng_types names the {', '.join(map(repr, unused))} generator(s), but this run is on "
            f"{strategy.root_device.type!r}: there is nothing to synchronise for them. Leave them out of rng_types.",
            UserWarning,
            stacklevel=3,
        )
    sharding = strategy.distributed_sampler_kwargs
    n, rank = (sharding["num_replicas"], sharding["rank"]) if sharding else (1, 0)
    iterable = isinstance(dataloader.dataset, IterableDataset)
    batch_size = _batch_size(dataloader)
    if split_batches and n > 1:
        _check_split(batch_size, n)
    seed = (data_seed if data_seed is not None else torch.initial_seed()) % _MAX_SEED
    common: dict[str, Any] = {
        "strategy": strategy,
        "original": dataloader,
        "rng_types": names,
        "sampler_generator": _sampler_generator(dataloader, seed),
        "place": batch_mover(strategy) if device_placement else None,
        "active_loaders": active_loaders,
        **loader_settings(dataloader),
        "generator": dataloader.generator
        if dataloader.generator is not None
        else torch.Generator().manual_seed((seed + 1 + rank) % _MAX_SEED),
    }
    per_process = batch_size // n if split_batches and batch_size else batch_size
    total = None if batch_size is None else (batch_size if split_batches else batch_size * n)
    sizes: dict[str, Any] = {"per_process_batch_size": per_process, "total_batch_size": total}

    if n > 1 and _uses_distributed_sampler(dataloader):
        if split_batches:
            raise ValueError(
                "split_batches=True cannot split batches that a DistributedSampler already shares out. "
                "Give the DataLoader a plain sampler (drivetrain shards it), or use split_batches=False."
            )
        warnings.warn(
            "The DataLoader already uses a DistributedSampler, so drivetrain keeps it and does not shard "
            "again; gather_for_metrics cannot drop the items it repeats to even out the ranks. Use a plain "
            "sampler (or shuffle=True) and let drivetrain shard the batches.",
            UserWarning,
            stacklevel=3,
        )
        return _sharded(dataloader, common, sizes, ShardedBatchSampler(dataloader.batch_sampler or []))

    dispatch = n > 1 and (iterable if dispatch_batches is None else dispatch_batches)
    if dispatch:
        return _dispatching(dataloader, common, sizes, split_batches, even_batches, batch_size)
    if iterable:
        return _iterable_sharded(dataloader, common, sizes, n, rank, split_batches, per_process)
    if dataloader.batch_sampler is None:
        if n > 1:
            raise ValueError(
                "This DataLoader has batch_size=None (the dataset returns whole batches), which drivetrain "
                "can only share out by dispatching: pass dispatch_batches=True (DataLoaderConfiguration), "
                "or give the DataLoader a batch_size."
            )
        return ShardedDataLoader(
            dataloader.dataset, sampler=dataloader.sampler, batch_size=None, **common, **sizes
        )
    sharded = ShardedBatchSampler(
        dataloader.batch_sampler, n, rank, split_batches=split_batches, even_batches=even_batches
    )
    return _sharded(dataloader, common, sizes, sharded)


def _sharded(
    dataloader: DataLoader, common: dict[str, Any], sizes: dict[str, Any], batch_sampler: ShardedBatchSampler
) -> PreparedDataLoader:
    return ShardedDataLoader(dataloader.dataset, batch_sampler=batch_sampler, **common, **sizes)


def _iterable_sharded(
    dataloader: DataLoader,
    common: dict[str, Any],
    sizes: dict[str, Any],
    n: int,
    rank: int,
    split_batches: bool,
    per_process: int | None,
) -> PreparedDataLoader:
    if n == 1:
        return ShardedDataLoader(
            dataloader.dataset,
            batch_size=dataloader.batch_size,
            drop_last=dataloader.drop_last,
            **common,
            **sizes,
        )
    if dataloader.num_workers > 0:
        warnings.warn(
            f"dispatch_batches=False with an iterable dataset and num_workers={dataloader.num_workers}: every "
            f"worker of every process reads the whole dataset unless the dataset splits itself by worker "
            f"(torch.utils.data.get_worker_info), and gather_for_metrics cannot drop the items repeated at the "
            f"end. Use num_workers=0 or dispatch_batches=True.",
            UserWarning,
            stacklevel=4,
        )
    shard = IterableDatasetShard(
        dataloader.dataset, per_process or 1, n, rank, drop_last=dataloader.drop_last
    )
    return ShardedDataLoader(shard, batch_size=per_process, **common, **sizes)


def _dispatching(
    dataloader: DataLoader,
    common: dict[str, Any],
    sizes: dict[str, Any],
    split_batches: bool,
    even_batches: bool,
    batch_size: int | None,
) -> PreparedDataLoader:
    dispatch: dict[str, Any] = {
        "split_batches": split_batches,
        "even_batches": even_batches,
        "full_batch_size": batch_size,
    }
    if dataloader.batch_sampler is not None and not isinstance(dataloader.dataset, IterableDataset):
        return DispatchingDataLoader(
            dataloader.dataset,
            batch_sampler=ShardedBatchSampler(dataloader.batch_sampler),
            **dispatch,
            **common,
            **sizes,
        )
    return DispatchingDataLoader(
        dataloader.dataset,
        batch_size=dataloader.batch_size,
        drop_last=dataloader.drop_last,
        sampler=None if isinstance(dataloader.dataset, IterableDataset) else dataloader.sampler,
        **dispatch,
        **common,
        **sizes,
    )


def _batch_size(dataloader: DataLoader) -> int | None:
    if dataloader.batch_size is not None:
        return dataloader.batch_size
    return getattr(dataloader.batch_sampler, "batch_size", None)


def _check_split(batch_size: int | None, n: int) -> None:
    if batch_size is None:
        raise ValueError(
            "split_batches=True needs a DataLoader with a fixed batch_size (or a batch sampler with one) to "
            "split across processes. Set batch_size, or use split_batches=False."
        )
    if batch_size % n:
        raise ValueError(
            f"split_batches=True cuts each batch of {batch_size} into {n} equal parts, which is impossible. "
            f"Use a batch size that is a multiple of {n} (e.g. {-(-batch_size // n) * n}), or "
            f"split_batches=False."
        )


def _uses_distributed_sampler(dataloader: DataLoader) -> bool:
    sampler = getattr(dataloader.batch_sampler, "sampler", None)
    return isinstance(sampler, DistributedSampler) or isinstance(dataloader.sampler, DistributedSampler)


def _sampler_generator(dataloader: DataLoader, seed: int) -> torch.Generator | None:
    """The generator the loader's shuffling draws from, given one if it has none.

    A shuffling sampler without a generator draws from torch's global one, which differs between
    processes and cannot be rewound to redraw an epoch's order on resume.
    """
    for holder in (
        getattr(dataloader.batch_sampler, "sampler", None),
        dataloader.batch_sampler,
        dataloader.sampler,
    ):
        if holder is not None and hasattr(holder, "generator"):
            if holder.generator is None:
                holder.generator = torch.Generator().manual_seed(seed)
            return holder.generator
    return None


def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
    """A loader that starts ``num_batches`` batches into its next epoch.

    For a prepared loader this sets where its next epoch starts (once; later epochs start at
    the beginning) and returns the same loader; the batches are skipped as indices, without
    loading them. Any other ``DataLoader`` is wrapped in one that skips them at every iteration.
    """
    if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 0:
        raise ValueError(f"num_batches must be an int >= 0, got {num_batches!r}.")
    if isinstance(dataloader, PreparedDataLoader):
        dataloader.start_next_epoch_at(num_batches)
        return dataloader
    if not isinstance(dataloader, DataLoader):
        raise TypeError(f"skip_first_batches expects a DataLoader, got {type(dataloader).__name__}.")
    if dataloader.batch_sampler is None or isinstance(dataloader.dataset, IterableDataset):
        return _SkippingIterable(dataloader, num_batches)
    settings = loader_settings(dataloader)
    settings["generator"] = dataloader.generator
    return DataLoader(
        dataloader.dataset, batch_sampler=_SkipBatches(dataloader.batch_sampler, num_batches), **settings
    )


class _SkipBatches(Sampler[list[int]]):
    def __init__(self, batch_sampler: Any, skip: int) -> None:
        self.batch_sampler = batch_sampler
        self.skip = skip
        self.batch_size = getattr(batch_sampler, "batch_size", None)
        self.drop_last = getattr(batch_sampler, "drop_last", False)

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.batch_sampler), self.skip, None)

    def __len__(self) -> int:
        return max(0, len(self.batch_sampler) - self.skip)


class _SkippingIterable:
    """Iterates a loader whose batches cannot be skipped as indices, dropping the first ones."""

    def __init__(self, dataloader: DataLoader, skip: int) -> None:
        self.dataloader = dataloader
        self.skip = skip

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.dataloader), self.skip, None)

    def __len__(self) -> int:
        return max(0, len(self.dataloader) - self.skip)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dataloader, name)
