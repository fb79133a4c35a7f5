"""Turn a user's ``DataLoader`` into the one each process should iterate.

:func:`prepare_data_loader` is the one entry point both front doors use: it reads the number of
processes and this process's rank from the strategy, picks sharding or dispatching, and returns a
:class:`~drivetrain.data.PreparedDataLoader`.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterable, Iterator
from enum import Enum
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
)

from drivetrain._utilities.seed import worker_seeding_requested
from drivetrain.data.dispatch import DispatchingDataLoader
from drivetrain.data.iterable import IterableDatasetShard
from drivetrain.data.loader import (
    ActiveLoaders,
    GlobalDraws,
    PreparedDataLoader,
    ShardedDataLoader,
    data_parallel_share,
    loader_settings,
)
from drivetrain.data.samplers import ShardedBatchSampler
from drivetrain.data.seeding import SeedableRandomSampler, WorkerSeeder
from drivetrain.data.skipping import SkipBatchSampler
from drivetrain.strategies import rng
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
    use_seedable_sampler: bool = False,
    shard: bool = True,
    share: tuple[int, int] | None = None,
    active_loaders: ActiveLoaders | None = None,
    batch_mover: Callable[[Any], Any] | None = None,
    draw_global_seeds: bool = False,
) -> PreparedDataLoader:
    """The loader this process should iterate in place of ``dataloader``.

    A ``RandomSampler`` without a generator of its own (``shuffle=True``) is replaced by a
    :class:`~drivetrain.data.SeedableRandomSampler`: every epoch's order then depends only on
    ``(seed, epoch)``, the processes agree on rank 0's seed, and ``set_epoch(e)`` brings epoch
    ``e``'s order back. The loader's own generator (which seeds its worker processes) is reseeded
    from ``(seed, epoch, rank)`` at each epoch start, unless the user gave the loader one.

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
        rng_types: generators to copy from rank 0 at each epoch start: ``"torch"``, the device's
            generators (``"cuda"``, ``"xpu"``, ``"mps"``, ``"xla"``; through the accelerator's RNG
            hooks) and ``"generator"``, the generator of a sampler that is not seedable (always
            synchronised when there is one).
        device_placement: move batches to the strategy's device.
        data_seed: the seed of the shuffled order (default: ``torch.initial_seed()`` of rank 0,
            so ``set_seed`` decides the order).
        use_seedable_sampler: also make a ``RandomSampler`` that has its own generator seedable
            (its generator is then reseeded from ``(seed, epoch)`` at each epoch).
        shard: share the data between the processes; ``False`` gives every process all of it
            (the user's sampler or dataset shards it).
        share: ``(number of shares, this process's share)`` to shard for instead of the
            strategy's processes (Accelerate's free ``prepare_data_loader`` without a run); nothing
            is exchanged between processes then, so the strategy must be a one-process one.
        active_loaders: where the loader registers itself while it is being iterated.
        batch_mover: places each batch instead of the strategy's ``batch_mover()`` (a Trainer module's
            batch-transfer hooks); only with ``device_placement``.
        draw_global_seeds: at each epoch start, draw from torch's global generator the seeds the
            unprepared loader would draw there (its workers' base seed unless it has a generator;
            the seed of a ``RandomSampler`` without one, when the data is not sharded) and discard
            them, so the program's random numbers continue as they would with the plain loader
            (what PyTorch Lightning iterates: the Trainer's parity). The order is unaffected.

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
    requested = rng.validate_rng_types(rng_types)
    unused = rng.unused_device_types(strategy, requested)
    if unused:
        warnings.warn(
            f"rng_types names the {', '.join(map(repr, unused))} generator(s), but this run is on "
            f"{strategy.root_device.type!r}: there is nothing to synchronise for them. Leave them out of rng_types.",
            UserWarning,
            stacklevel=3,
        )
    if share is not None and strategy.world_size > 1:
        raise ValueError(
            f"share={share} shards for processes of their own, but the strategy runs {strategy.world_size} "
            f"processes, which share the data out themselves; leave share out."
        )
    n, rank = share if share is not None else data_parallel_share(strategy) if shard else (1, 0)
    # Read from the loader as the user built it, before its sampler is made seedable.
    draws = _global_draws(dataloader, sharded=shard and n > 1) if draw_global_seeds else None
    # Per-share seeds: the ranks of one tensor-parallel group (same share) draw alike.
    seed_rank = (
        rank if share is not None else data_parallel_share(strategy)[1] if shard else strategy.global_rank
    )
    iterable = isinstance(dataloader.dataset, IterableDataset)
    batch_size = _batch_size(dataloader)
    if split_batches and n > 1:
        _check_split(batch_size, n)
    seed = (data_seed if data_seed is not None else torch.initial_seed()) % _MAX_SEED
    sampler, batch_sampler = _seedable(dataloader, seed, use_seedable_sampler)
    index_sampler = getattr(batch_sampler, "sampler", None) if batch_sampler is not None else sampler
    if shard and strategy.world_size > 1 and isinstance(index_sampler, SeedableRandomSampler):
        # One permutation shared out: every process shuffles with rank 0's seed.
        index_sampler.initial_seed = strategy.broadcast(index_sampler.initial_seed, src=0)
    sampler_generator = _sampler_generator(batch_sampler, sampler, seed)
    names = tuple(name for name in requested if name != "generator")
    if sampler_generator is not None:
        names = ("generator", *names)
    settings = loader_settings(dataloader)
    if dataloader.num_workers > 0 and worker_seeding_requested():
        settings["worker_init_fn"] = WorkerSeeder(seed_rank, dataloader.worker_init_fn)
    common: dict[str, Any] = {
        "strategy": strategy,
        "original": dataloader,
        "rng_types": names,
        "sampler_generator": sampler_generator,
        "place": (batch_mover or strategy.batch_mover()) if device_placement else None,
        "active_loaders": active_loaders,
        **settings,
        "generator": dataloader.generator if dataloader.generator is not None else torch.Generator(),
        "epoch_seed": (seed, seed_rank) if dataloader.generator is None else None,
        "global_draws": draws,
    }
    per_process = batch_size // n if split_batches and batch_size else batch_size
    total = None if batch_size is None else (batch_size if split_batches else batch_size * n)
    sizes: dict[str, Any] = {"per_process_batch_size": per_process, "total_batch_size": total}

    if n > 1 and uses_distributed_sampler(dataloader):
        if split_batches:
            raise ValueError(
                "split_batches=True cannot split batches that a DistributedSampler already shares out. "
                "Give the DataLoader a plain sampler (drivetrain shards it), or use split_batches=False."
            )
        n, rank = 1, 0  # the user's sampler shares the data out already
    sizes["batches_per_step"] = 1 if split_batches else n
    dispatch = n > 1 and (iterable if dispatch_batches is None else dispatch_batches)
    if dispatch and share is not None:
        raise ValueError(
            "Dispatching batches sends them from process 0 to the others, which needs the processes of a running "
            "job; sharding for a share given by hand cannot do it. Use dispatch_batches=False, or prepare the loader "
            "in the job (Accelerator.prepare)."
        )
    if dispatch:
        return _dispatching(dataloader, common, sizes, split_batches, even_batches, batch_size, batch_sampler)
    if iterable:
        return _iterable_sharded(dataloader, common, sizes, n, rank, split_batches, per_process)
    if batch_sampler is None and isinstance(sampler, BatchSampler):
        # DataLoader(sampler=BatchSampler(...), batch_size=None): the sampler hands out whole
        # batches of indices, so it is shared out like a batch sampler.
        sharded = ShardedBatchSampler(
            sampler, n, rank, split_batches=split_batches, even_batches=even_batches
        )
        return ShardedDataLoader(dataloader.dataset, sampler=sharded, batch_size=None, **common, **sizes)
    if batch_sampler is None:
        if n > 1:
            raise ValueError(
                "This DataLoader has batch_size=None (the dataset returns whole batches), which drivetrain "
                "can only share out by dispatching: pass dispatch_batches=True (DataLoaderConfiguration), "
                "or give the DataLoader a batch_size."
            )
        return ShardedDataLoader(dataloader.dataset, sampler=sampler, batch_size=None, **common, **sizes)
    sharded = ShardedBatchSampler(
        batch_sampler, n, rank, split_batches=split_batches, even_batches=even_batches
    )
    return ShardedDataLoader(dataloader.dataset, batch_sampler=sharded, **common, **sizes)


def _global_draws(dataloader: DataLoader, sharded: bool) -> GlobalDraws:
    """What iterating ``dataloader`` unprepared draws from torch's global generator at each epoch start."""
    sampler = getattr(dataloader.batch_sampler, "sampler", None) or dataloader.sampler
    # A sharded loader stands in for a DistributedSampler (Lightning's choice), which draws nothing.
    shuffles = isinstance(sampler, RandomSampler) and sampler.generator is None and not sharded
    return GlobalDraws(
        base_seed=dataloader.generator is None,
        # Persistent workers keep their iterator, and its base seed, from the first epoch on.
        base_seed_once=dataloader.persistent_workers and dataloader.num_workers > 0,
        sampler_seed=shuffles,
    )


def can_prepare(loader: Any) -> bool:
    """Whether :func:`prepare_data_loader` keeps everything ``loader`` does.

    A prepared loader is rebuilt from the loader's dataset, samplers and settings, so a
    ``DataLoader`` subclass that changes how it iterates (its own ``__iter__`` or ``__len__``)
    would lose that: such loaders, and iterables that are not ``DataLoader``s, cannot be prepared.
    """
    if not isinstance(loader, DataLoader):
        return False
    kind = type(loader)
    return all(getattr(kind, name) is getattr(DataLoader, name) for name in _ITERATION)


_ITERATION = ("__iter__", "__len__", "_get_iterator")


def _seedable(dataloader: DataLoader, seed: int, use_seedable_sampler: bool) -> tuple[Any, Any]:
    """The loader's sampler and batch sampler, with a plain ``RandomSampler`` made seedable.

    A ``RandomSampler`` with a generator of its own (``DataLoader(shuffle=True, generator=g)``)
    keeps drawing from it unless ``use_seedable_sampler`` asks otherwise; custom samplers and
    batch samplers are kept as they are. The user's objects are not changed.
    """
    sampler, batch_sampler = dataloader.sampler, dataloader.batch_sampler
    if isinstance(dataloader.dataset, IterableDataset) or type(sampler) is not RandomSampler:
        return sampler, batch_sampler
    if sampler.generator is not None and not use_seedable_sampler:
        return sampler, batch_sampler
    if batch_sampler is not None and type(batch_sampler) is not BatchSampler:
        return sampler, batch_sampler  # a custom batch sampler holds the user's sampler: keep both
    seedable = SeedableRandomSampler(
        sampler.data_source,
        replacement=sampler.replacement,
        num_samples=sampler._num_samples,
        generator=sampler.generator,
        data_seed=seed,
    )
    if batch_sampler is None:
        return seedable, None
    return seedable, BatchSampler(seedable, batch_sampler.batch_size, batch_sampler.drop_last)


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
    batch_sampler: Any,
) -> PreparedDataLoader:
    dispatch: dict[str, Any] = {
        "split_batches": split_batches,
        "even_batches": even_batches,
        "full_batch_size": batch_size,
    }
    if batch_sampler is not None and not isinstance(dataloader.dataset, IterableDataset):
        return DispatchingDataLoader(
            dataloader.dataset,
            batch_sampler=ShardedBatchSampler(batch_sampler),
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
    if dataloader.batch_sampler is None and isinstance(dataloader.sampler, BatchSampler):
        return dataloader.sampler.batch_size  # sampler=BatchSampler(...), batch_size=None
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


def uses_distributed_sampler(dataloader: DataLoader) -> bool:
    """Whether ``dataloader`` shares its data out itself, through a ``DistributedSampler``."""
    sampler = getattr(dataloader.batch_sampler, "sampler", None)
    return isinstance(sampler, DistributedSampler) or isinstance(dataloader.sampler, DistributedSampler)


def _sampler_generator(batch_sampler: Any, sampler: Any, seed: int) -> torch.Generator | None:
    """The generator a sampler that is not seedable shuffles with, given one if it has none.

    Such a sampler without a generator draws from torch's global one, which differs between
    processes and cannot be rewound to redraw an epoch's order on resume. Its generator is
    copied from rank 0 at each epoch start (``rng_types`` ``"generator"``).
    """
    for holder in (
        getattr(batch_sampler, "sampler", None),
        batch_sampler,
        getattr(sampler, "sampler", None),
        sampler,
    ):
        if holder is None or isinstance(holder, SeedableRandomSampler):
            continue
        if hasattr(holder, "generator"):
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
        dataloader.dataset, batch_sampler=SkipBatchSampler(dataloader.batch_sampler, num_batches), **settings
    )


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
