"""The prepared loader in one process: look-ahead, epochs, the resumable position, skipping."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler, TensorDataset

import drivetrain as dt
from drivetrain.data import ActiveLoaders, PreparedDataLoader, prepare_data_loader, skip_first_batches


@pytest.fixture
def strategy() -> dt.strategies.Strategy:
    return dt.connect(accelerator="cpu")


def _dataset(size: int = 20) -> TensorDataset:
    return TensorDataset(torch.arange(size))


def _ids(loader: object) -> list[list[int]]:
    return [batch[0].tolist() for batch in loader]  # type: ignore[attr-defined]


def test_the_loader_knows_its_last_batch_while_it_is_in_use(strategy: dt.strategies.Strategy) -> None:
    active = ActiveLoaders()
    loader = prepare_data_loader(DataLoader(_dataset(10), batch_size=4), strategy, active_loaders=active)
    assert isinstance(loader, DataLoader) and len(loader) == 3 and loader.batch_size == 4
    flags = []
    for _ in loader:
        flags.append((loader.end_of_dataloader, active.current is loader))
    assert flags == [(False, True), (False, True), (True, True)]
    assert active.current is None
    for _ in loader:
        break  # leaving early unregisters the loader too
    assert active.current is None and not loader.end_of_dataloader


class _ReadLog(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Map-style data that records which items were read."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.read: list[int] = []

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        self.read.append(index)
        return torch.tensor(index)


def test_map_style_batches_are_read_when_used_and_the_end_is_still_known(
    strategy: dt.strategies.Strategy,
) -> None:
    # The batch sampler's length gives the last batch: no batch is read ahead of the one in use
    # (nothing extra kept alive through each step) until the predicted last one confirms the end.
    data = _ReadLog(10)
    loader = prepare_data_loader(DataLoader(data, batch_size=4), strategy)
    seen = [(batch.tolist(), max(data.read), loader.end_of_dataloader) for batch in loader]
    assert seen == [([0, 1, 2, 3], 3, False), ([4, 5, 6, 7], 7, False), ([8, 9], 9, True)]

    # Resumed after the first batch: the same, from the next unseen batch on.
    iterator = iter(loader)
    next(iterator)
    saved = loader.state_dict()
    data.read.clear()
    resumed = prepare_data_loader(DataLoader(data, batch_size=4), strategy)
    resumed.load_state_dict(saved)
    seen = [(batch.tolist(), max(data.read), resumed.end_of_dataloader) for batch in resumed]
    assert seen == [([4, 5, 6, 7], 7, False), ([8, 9], 9, True)]


def test_data_without_a_trustworthy_length_is_read_one_batch_ahead(strategy: dt.strategies.Strategy) -> None:
    class Stream(IterableDataset):  # type: ignore[type-arg]
        def __init__(self) -> None:
            self.read: list[int] = []

        def __iter__(self) -> Iterator[torch.Tensor]:
            for index in range(5):
                self.read.append(index)
                yield torch.tensor(index)

    class Unsized(Sampler[int]):
        def __iter__(self) -> Iterator[int]:
            return iter(range(5))

    stream = Stream()
    loader = prepare_data_loader(DataLoader(stream, batch_size=2), strategy)
    seen = [(batch.tolist(), max(stream.read), loader.end_of_dataloader) for batch in loader]
    assert seen == [([0, 1], 3, False), ([2, 3], 4, False), ([4], 4, True)]

    data = _ReadLog(5)
    loader = prepare_data_loader(DataLoader(data, batch_size=2, sampler=Unsized()), strategy)
    seen = [(batch.tolist(), max(data.read), loader.end_of_dataloader) for batch in loader]
    assert seen == [([0, 1], 3, False), ([2, 3], 4, False), ([4], 4, True)]


def test_set_seed_decides_the_shuffle_and_epochs_differ(strategy: dt.strategies.Strategy) -> None:
    def orders() -> list[list[list[int]]]:
        dt.seed_everything(7)
        loader = prepare_data_loader(DataLoader(_dataset(), batch_size=5, shuffle=True), strategy)
        return [_ids(loader), _ids(loader)]

    first, again = orders(), orders()
    assert first == again
    assert first[0] != first[1]
    assert sorted(i for batch in first[0] for i in batch) == list(range(20))


def test_the_global_generator_is_not_consumed_by_iteration(strategy: dt.strategies.Strategy) -> None:
    loader = prepare_data_loader(DataLoader(_dataset(), batch_size=5, shuffle=True), strategy)
    state = torch.get_rng_state()
    _ids(loader)
    assert torch.equal(state, torch.get_rng_state())


def test_a_resumed_loader_continues_with_the_next_unseen_batch(strategy: dt.strategies.Strategy) -> None:
    def fresh() -> PreparedDataLoader:
        dt.seed_everything(3)
        return prepare_data_loader(DataLoader(_dataset(), batch_size=3, shuffle=True), strategy)

    loader = fresh()
    epoch0 = _ids(loader)
    iterator = iter(loader)
    seen = [next(iterator)[0].tolist() for _ in range(3)]
    saved = loader.state_dict()
    rest_of_epoch1 = [batch[0].tolist() for batch in iterator]
    epoch2 = _ids(loader)
    assert saved["epoch"] == 1 and saved["batches_yielded"] == 3 and saved["in_epoch"]

    resumed = fresh()
    resumed.load_state_dict(saved)
    assert _ids(resumed) == rest_of_epoch1
    assert _ids(resumed) == epoch2
    assert seen + rest_of_epoch1 != epoch0  # a new order each epoch, and the resume kept it


def test_set_epoch_reaches_epoch_aware_samplers(strategy: dt.strategies.Strategy) -> None:
    class Recording(Sampler[int]):
        def __init__(self) -> None:
            self.epochs: list[int] = []

        def set_epoch(self, epoch: int) -> None:
            self.epochs.append(epoch)

        def __iter__(self) -> Iterator[int]:
            return iter(range(4))

        def __len__(self) -> int:
            return 4

    sampler = Recording()
    loader = prepare_data_loader(DataLoader(_dataset(4), batch_size=2, sampler=sampler), strategy)
    _ids(loader)
    _ids(loader)
    loader.set_epoch(10)
    _ids(loader)
    assert sampler.epochs == [0, 1, 10, 10]
    assert loader.epoch == 11
    with pytest.raises(ValueError, match="set_epoch expects an int >= 0"):
        loader.set_epoch(-1)


def test_skip_first_batches(strategy: dt.strategies.Strategy) -> None:
    prepared = prepare_data_loader(DataLoader(_dataset(10), batch_size=2), strategy)
    assert skip_first_batches(prepared, 3) is prepared
    assert _ids(prepared) == [[6, 7], [8, 9]]
    assert len(_ids(prepared)) == 5, "only the next epoch is shortened"
    raw = skip_first_batches(DataLoader(_dataset(10), batch_size=2), 4)
    assert _ids(raw) == _ids(raw) == [[8, 9]] and len(raw) == 1

    class Stream(IterableDataset):  # type: ignore[type-arg]
        def __iter__(self) -> Iterator[torch.Tensor]:
            return iter(torch.arange(6))

    stream = skip_first_batches(DataLoader(Stream(), batch_size=2), 1)
    assert [b.tolist() for b in stream] == [[2, 3], [4, 5]]
    with pytest.raises(ValueError, match="num_batches must be an int >= 0"):
        skip_first_batches(prepared, -2)


def test_a_loader_without_batches_and_bad_rng_types(strategy: dt.strategies.Strategy) -> None:
    unbatched = prepare_data_loader(DataLoader(_dataset(3), batch_size=None), strategy)
    assert [t[0].item() for t in unbatched] == [0, 1, 2]
    with pytest.raises(ValueError, match=r"cannot synchronise: 'tpu'"):
        prepare_data_loader(DataLoader(_dataset()), strategy, rng_types=["torch", "tpu"])
    with pytest.warns(UserWarning, match=r"names the 'cuda', 'xla' generator\(s\), but this run is on 'cpu'"):
        prepare_data_loader(DataLoader(_dataset()), strategy, rng_types=["torch", "cuda", "xla"])
    with pytest.raises(TypeError, match=r"Write rng_types=\['torch'\]"):
        prepare_data_loader(DataLoader(_dataset()), strategy, rng_types="torch")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"expects a torch\.utils\.data\.DataLoader"):
        prepare_data_loader([1, 2], strategy)  # type: ignore[arg-type]
    prepared = prepare_data_loader(DataLoader(_dataset()), strategy)
    assert prepare_data_loader(prepared, strategy) is prepared


def test_resuming_with_worker_processes_skips_the_seen_batches(strategy: dt.strategies.Strategy) -> None:
    # DataLoader's worker iterator calls iter() on the batch sampler twice; the skip must survive that.
    def fresh() -> PreparedDataLoader:
        dt.seed_everything(5)
        return prepare_data_loader(
            DataLoader(_dataset(12), batch_size=3, shuffle=True, num_workers=1), strategy
        )

    loader = fresh()
    iterator = iter(loader)
    next(iterator)
    saved = loader.state_dict()
    rest = [batch[0].tolist() for batch in iterator]
    resumed = fresh()
    resumed.load_state_dict(saved)
    assert _ids(resumed) == rest and len(rest) == 3
