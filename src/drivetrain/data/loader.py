"""The prepared data loader: the end of the data known in time, device placement, epochs and a resumable position.

:class:`PreparedDataLoader` is a ``torch.utils.data.DataLoader`` (so code that checks for one
keeps working) that

* knows the epoch's last batch while it is in use (:attr:`end_of_dataloader`; gradient
  accumulation syncs there, metrics drop the repeated items there): map-style data counts its
  batches (the batch sampler's length) and reads one batch ahead only to confirm the end at the
  predicted last one; data without a trustworthy length is read one batch ahead throughout;
* puts each batch on the strategy's device;
* at the start of each epoch, copies rank 0's generator states to every process (``rng_types``)
  and tells epoch-aware samplers and datasets the epoch;
* knows its position: :meth:`state_dict` records the epoch, the batches handed out in it and the
  generator states at its start, and after :meth:`load_state_dict` the next iteration continues
  with the next unseen batch of that same epoch.

Subclasses decide where a process's batches come from: :class:`ShardedDataLoader` (each process
loads its own share, chosen at the batch-sampler level) and
:class:`~drivetrain.data.dispatch.DispatchingDataLoader` (rank 0 loads, the others receive).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from drivetrain.data import seeding
from drivetrain.strategies import rng
from drivetrain.strategies.strategy import Strategy


class ActiveLoaders:
    """The prepared loaders being iterated right now, innermost last (an evaluation loop inside
    a training loop makes two). A front door owns one and hands it to the loaders it prepares."""

    __slots__ = ("stack",)

    def __init__(self) -> None:
        #: The loaders, innermost last (read it; change it through push/remove).
        self.stack: list[PreparedDataLoader] = []

    def push(self, loader: PreparedDataLoader) -> None:
        self.stack.append(loader)

    def remove(self, loader: PreparedDataLoader) -> None:
        for index in range(len(self.stack) - 1, -1, -1):
            if self.stack[index] is loader:
                del self.stack[index]
                return

    @property
    def current(self) -> PreparedDataLoader | None:
        """The innermost loader being iterated, if any."""
        return self.stack[-1] if self.stack else None

    @property
    def end_of_dataloader(self) -> bool:
        """Whether the innermost loader has handed out its last batch of the epoch."""
        return bool(self.stack) and self.stack[-1].end_of_dataloader


def loader_settings(dataloader: DataLoader) -> dict[str, Any]:
    """The worker, collation and memory settings of ``dataloader``, to build its replacement with."""
    settings: dict[str, Any] = {
        "num_workers": dataloader.num_workers,
        "collate_fn": dataloader.collate_fn,
        "pin_memory": dataloader.pin_memory,
        "timeout": dataloader.timeout,
        "worker_init_fn": dataloader.worker_init_fn,
        "multiprocessing_context": dataloader.multiprocessing_context,
        "persistent_workers": dataloader.persistent_workers,
    }
    if hasattr(dataloader, "in_order"):  # torch >= 2.6
        settings["in_order"] = dataloader.in_order
    if dataloader.num_workers > 0:
        settings["prefetch_factor"] = dataloader.prefetch_factor
    if getattr(dataloader, "pin_memory_device", ""):
        settings["pin_memory_device"] = dataloader.pin_memory_device
    return settings


def data_parallel_share(strategy: Strategy) -> tuple[int, int]:
    """``(how many shares the data is split into, which one this process reads)``.

    From the strategy's ``distributed_sampler_kwargs``: the data-parallel ranks, which under
    tensor or context parallelism are fewer than the processes (the ranks of one such group
    read the same share). ``(1, 0)`` when the strategy does not shard data.
    """
    sharding = strategy.distributed_sampler_kwargs
    return (sharding["num_replicas"], sharding["rank"]) if sharding else (1, 0)


def check_epoch(epoch: Any) -> int:
    """``epoch`` if it is an epoch number (an int >= 0), else the ``ValueError`` ``set_epoch`` raises."""
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"set_epoch expects an int >= 0, got {epoch!r}.")
    return epoch


def check_batch_count(batch: Any) -> int:
    """``batch`` if it is a number of batches to skip (an int >= 0), else a ``ValueError``."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
        raise ValueError(f"The number of batches to skip must be an int >= 0, got {batch!r}.")
    return batch


@dataclass(frozen=True)
class GlobalDraws:
    """The seeds a plain ``DataLoader`` draws from torch's global generator when an epoch's iteration starts."""

    #: its workers' base seed (a loader without a ``generator`` of its own)
    base_seed: bool
    #: ... on the first iteration only (persistent workers keep their iterator)
    base_seed_once: bool
    #: a ``RandomSampler`` without a generator's seed for the epoch's order
    sampler_seed: bool


class PreparedDataLoader(DataLoader):
    """Base of the prepared loaders; see the module docstring. Built by
    :func:`~drivetrain.data.prepare_data_loader`, not directly."""

    def __init__(
        self,
        dataset: Any,
        *,
        strategy: Strategy,
        original: DataLoader,
        rng_types: Sequence[str],
        sampler_generator: torch.Generator | None,
        place: Callable[[Any], Any] | None,
        active_loaders: ActiveLoaders | None,
        per_process_batch_size: int | None,
        total_batch_size: int | None,
        batches_per_step: int = 1,
        epoch_seed: tuple[int, int] | None = None,
        global_draws: GlobalDraws | None = None,
        **dataloader_kwargs: Any,
    ) -> None:
        super().__init__(dataset, **dataloader_kwargs)
        self._global_draws = global_draws
        self._epochs_started = 0
        self._strategy = strategy
        self._rng_types = tuple(rng_types)
        self._sampler_generator = sampler_generator
        self._place = place
        self._active = active_loaders
        self._total_batch_size = total_batch_size
        self._batches_per_step = batches_per_step
        self._epoch_seed = epoch_seed
        self._epoch_aware = [
            target.set_epoch
            for target in _epoch_targets(self)
            if callable(getattr(target, "set_epoch", None))
        ]
        # DataLoader refuses these after construction; show the user's values (read-only), and the
        # sampler that decides the order.
        object.__setattr__(self, "batch_size", per_process_batch_size)
        object.__setattr__(self, "drop_last", original.drop_last)
        index_sampler = (
            getattr(self.batch_sampler, "sampler", None) if self.batch_sampler is not None else None
        )
        object.__setattr__(self, "sampler", index_sampler if index_sampler is not None else self.sampler)
        #: The loader this one replaces.
        self.base_dataloader = original
        #: True while the last batch of the epoch is in use.
        self.end_of_dataloader = False
        #: Repeated items in the final (gathered) round of the epoch, known once it is reached.
        self.padding = 0
        self._epoch = 0
        # Counted per batch: a slotted holder, since DataLoader.__setattr__ is slow Python code.
        self._position = _Position()
        self._in_epoch = False
        self._resume_at: int | None = None
        self._epoch_start: dict[str, torch.Tensor] = {}

    # -- what subclasses provide -------------------------------------------------------------
    def _source(self, start_at: int) -> Iterator[Any]:
        """This process's batches for one epoch, starting with its ``start_at``-th batch."""
        raise NotImplementedError

    def _final_padding(self) -> int:
        """Repeated items in the final round, read once the source is exhausted."""
        return 0

    # -- iteration ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        start_at = self._begin_epoch()
        active = self._active
        if active is not None:
            active.push(self)
        place = self._place
        position = self._position
        try:
            source = self._source(start_at)
            # Batches before the one the length says is the last are handed out as they are read:
            # reading ahead there would only keep a second batch alive through every step, which
            # costs per-step time (allocator churn, a batch gone cold in the caches by its use).
            certain = self._batches_known_not_last(start_at)
            if certain > 0:
                batches = itertools.islice(source, certain)
                # The epoch's first batch is looked at once (a collate_fn that returns None); the rest are not.
                first = next(batches, _MISSING)
                if first is not _MISSING:
                    if first is None:
                        _warn_none_batch(start_at, self._epoch)
                    if place is not None:
                        first = place(first)
                    position.yielded += 1
                    yield first
                for batch in batches:
                    if place is not None:
                        batch = place(batch)
                    position.yielded += 1
                    yield batch
            # From the predicted last batch on (or throughout, when the length is unknown) one batch is
            # read ahead, so the true end is known while the last batch is in use.
            try:
                current = next(source)
            except StopIteration:
                self._end_epoch()
                return
            if certain <= 0 and current is None:
                _warn_none_batch(start_at, self._epoch)
            # Each batch is placed as it is handed out (after the look-ahead read of the next one), so
            # whatever placement runs (a Trainer module's batch-transfer hooks) sees the batches in step order.
            for upcoming in source:
                if place is not None:
                    current = place(current)
                position.yielded += 1
                yield current
                current = upcoming
            if place is not None:
                current = place(current)
            self.padding = self._final_padding()
            self.end_of_dataloader = True
            position.yielded += 1
            yield current
            self._end_epoch()
        finally:
            if active is not None:
                active.remove(self)

    def _batches_known_not_last(self, start_at: int) -> int:
        """How many of this epoch's next batches are surely not its last (0: read ahead from the start).

        Subclasses whose length counts the batches :meth:`_source` yields exactly say so here.
        """
        return 0

    def _begin_epoch(self) -> int:
        self.end_of_dataloader = False
        self.padding = 0
        start_at, self._resume_at = self._resume_at, None
        if start_at is None:
            # A resumed epoch continues with the states it started with; a new one starts in step.
            if self._global_draws is not None:
                self._draw_global_seeds(self._global_draws)
            rng.synchronize(self._strategy, self._rng_types, self._sampler_generator)
            start_at = 0
        if self._epoch_seed is not None:
            # The workers' seeds, like the order, depend only on (seed, epoch) and the rank.
            seed, rank = self._epoch_seed
            self.generator.manual_seed(seeding.epoch_seed(seed, self._epoch, rank))
        self._epoch_start = self._generator_states()
        for set_epoch in self._epoch_aware:
            set_epoch(self._epoch)
        self._position.yielded = start_at
        self._in_epoch = True
        return start_at

    def _draw_global_seeds(self, draws: GlobalDraws) -> None:
        """Draw (and drop) what the plain loader would draw from torch's global generator here; see
        :func:`~drivetrain.data.prepare_data_loader` (``draw_global_seeds``)."""
        count = int(draws.sampler_seed)
        if draws.base_seed and not (draws.base_seed_once and self._epochs_started):
            count += 1
        self._epochs_started += 1
        for _ in range(count):
            torch.empty((), dtype=torch.int64).random_()

    def _end_epoch(self) -> None:
        self._in_epoch = False
        self._position.yielded = 0
        self._epoch += 1

    # -- epochs and position ---------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch being iterated (or the next one, between epochs)."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch number given to epoch-aware samplers and datasets (like ``DistributedSampler``)."""
        self._epoch = check_epoch(epoch)
        for set_epoch in self._epoch_aware:
            set_epoch(epoch)

    def start_next_epoch_at(self, batch: int) -> None:
        """Make the next iteration begin with this process's ``batch``-th batch (0-based), once."""
        self._resume_at = check_batch_count(batch)

    @property
    def next_epoch_start(self) -> int:
        """This process's batch the next iteration begins with: 0, or where a resume put it."""
        return self._resume_at or 0

    def merge_process_results(self, per_process: Sequence[Sequence[Any]]) -> list[Any]:
        """One result per batch from every process (``per_process[rank]``), in the order of the batches.

        For loaders that deal whole batches round-robin, this undoes the dealing, so results of a
        loader without ``shuffle`` come back in dataset order; otherwise process after process.
        """
        return [result for results in per_process for result in results]

    @property
    def total_batch_size(self) -> int | None:
        """Items per step across all processes (``None`` when batch sizes vary)."""
        return self._total_batch_size

    @property
    def remainder(self) -> int:
        """Real items in the final round once it is reached (``-1`` before that or when unknown)."""
        if not self.end_of_dataloader or self._total_batch_size is None:
            return -1
        return self._total_batch_size - self.padding

    def __getstate__(self) -> dict[str, Any]:
        # The device mover may be a closure made for this strategy: a copy asks the strategy again.
        state = self.__dict__.copy()
        state["_place"] = self._place is not None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._place = self._strategy.batch_mover() if state["_place"] else None

    def state_dict(self) -> dict[str, Any]:
        """Where this process stands: epoch, batches handed out in it, the seeds and generator
        states its order comes from, and how many of the underlying batches each step consumes."""
        return {
            "epoch": self._epoch,
            "in_epoch": self._in_epoch,
            "batches_yielded": self._position.yielded if self._in_epoch else 0,
            "batches_per_step": self._batches_per_step,
            "seeds": self._seeds(),
            "generators": self._epoch_start if self._in_epoch else self._generator_states(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s position at the next iteration.

        A state saved with another number of processes (each step then consumed another number
        of the underlying batches) resumes at the first step that holds an unseen batch: no batch
        of the epoch is skipped, and fewer than one step's worth are seen again.
        """
        self._epoch = int(state["epoch"])
        self._set_seeds(state.get("seeds", {}))
        self._set_generator_states(state.get("generators", {}))
        if not state.get("in_epoch"):
            self._resume_at = None
            return
        yielded = int(state["batches_yielded"])
        saved_per_step = int(state.get("batches_per_step", self._batches_per_step))
        self._resume_at = yielded * saved_per_step // self._batches_per_step

    def _seeds(self) -> dict[str, int]:
        seeds = {}
        seedable = self._seedable_sampler()
        if seedable is not None:
            seeds["sampler"] = seedable.initial_seed
        if self._epoch_seed is not None:
            seeds["loader"] = self._epoch_seed[0]
        return seeds

    def _set_seeds(self, seeds: dict[str, int]) -> None:
        seedable = self._seedable_sampler()
        if "sampler" in seeds and seedable is not None:
            seedable.initial_seed = int(seeds["sampler"])
        if "loader" in seeds and self._epoch_seed is not None:
            self._epoch_seed = (int(seeds["loader"]), self._epoch_seed[1])

    def _seedable_sampler(self) -> seeding.SeedableRandomSampler | None:
        sampler = self.sampler
        return sampler if isinstance(sampler, seeding.SeedableRandomSampler) else None

    def _generators(self) -> dict[str, torch.Generator | None]:
        return {"sampler": self._sampler_generator, "loader": self.generator}

    def _generator_states(self) -> dict[str, torch.Tensor]:
        return rng.capture(self._strategy, (), self._generators()).get("generators", {})

    def _set_generator_states(self, states: dict[str, torch.Tensor]) -> None:
        rng.restore(self._strategy, {"generators": states}, self._generators())


class _Position:
    __slots__ = ("yielded",)

    def __init__(self) -> None:
        self.yielded = 0


class ShardedDataLoader(PreparedDataLoader):
    """Every process loads its own batches: a share of the batch sampler's (map-style data), or of
    each chunk of items (iterable data, through :class:`~drivetrain.data.IterableDatasetShard`)."""

    def _index_batches(self) -> Any:
        """What hands out batches of indices: the batch sampler, or a sampler that yields whole batches."""
        return self.batch_sampler if self.batch_sampler is not None else self.sampler

    def _source(self, start_at: int) -> Iterator[Any]:
        index_sampler: Any = self._index_batches()
        if start_at and hasattr(index_sampler, "start_at"):
            index_sampler.start_at = start_at  # skipped as indices: nothing is loaded
            return DataLoader.__iter__(self)
        batches = DataLoader.__iter__(self)
        for _ in itertools.islice(batches, start_at):
            pass  # iterable data has no indices to skip: read and drop
        return batches

    def _batches_known_not_last(self, start_at: int) -> int:
        # Map-style data: the batch sampler's length is the epoch's batch count (as for Lightning's
        # fetcher, which reads ahead only for loaders without one). An iterable dataset's length is
        # only a hint, so its batches are read ahead.
        if isinstance(self.dataset, IterableDataset):
            return 0
        try:
            total = len(self._index_batches())
        except TypeError:  # a sampler without a length
            return 0
        return max(0, total - start_at - 1)

    def _final_padding(self) -> int:
        batches = self._index_batches()
        source = batches if hasattr(batches, "padding") else self.dataset
        return int(getattr(source, "padding", 0))

    def merge_process_results(self, per_process: Sequence[Sequence[Any]]) -> list[Any]:
        sharding = self.batch_sampler
        dealt = getattr(sharding, "num_processes", 1) > 1 and not getattr(sharding, "split_batches", True)
        if not dealt:
            return super().merge_process_results(per_process)
        # Process r holds batches r, r + n, r + 2n, ...: take one from each process in turn.
        rounds = itertools.zip_longest(*per_process, fillvalue=_MISSING)
        return [result for round_ in rounds for result in round_ if result is not _MISSING]


_MISSING = object()


def _warn_none_batch(index: int, epoch: int) -> None:
    warnings.warn(
        f"The prepared DataLoader's batch {index} of epoch {epoch} is None: its collate_fn returned None. A batch is "
        f"what the training step gets (tensors, or tuples/lists/dicts of them); make collate_fn return it (a function "
        f"without `return` returns None). If None batches are intended, filter this warning.",
        UserWarning,
        stacklevel=3,
    )


def _epoch_targets(loader: DataLoader) -> list[Any]:
    """The objects of ``loader`` that may want ``set_epoch``: sampler, batch sampler, dataset."""
    # A sampler that yields whole batches (sampler=BatchSampler(...), batch_size=None) stands in for the batch sampler.
    holder = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    inner = getattr(holder, "batch_sampler", holder)  # inside the sharding
    targets: list[Any] = []
    for candidate in (
        getattr(inner, "sampler", None),
        inner,
        loader.sampler,
        loader.dataset,
    ):
        if candidate is not None and all(candidate is not seen for seen in targets):
            targets.append(candidate)
    return targets
