"""Prepared loaders in 2 real gloo processes: one shared shuffle, sharding vs dispatching, iterable data."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset

import drivetrain as dt
from drivetrain.data import prepare_data_loader
from helpers.multiprocess import run_processes

pytestmark = pytest.mark.multiprocess


class Stream(IterableDataset):  # type: ignore[type-arg]
    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(torch.arange(self.size))


def _ids(loader: DataLoader) -> list[list[int]]:
    return [(batch[0] if isinstance(batch, list) else batch).tolist() for batch in loader]


def _rank(rank: int, world_size: int) -> dict[str, Any]:
    strategy = dt.connect(accelerator="cpu", strategy="ddp", devices=world_size)
    strategy.setup_environment()
    out: dict[str, Any] = {}
    data = TensorDataset(torch.arange(99))

    # Each process seeds differently; the loader still shuffles one permutation for all.
    dt.seed_everything(100 + rank)
    shuffled = prepare_data_loader(
        DataLoader(data, batch_size=16, shuffle=True), strategy, rng_types=["torch"]
    )
    out["shuffled"] = [_ids(shuffled), _ids(shuffled)]
    out["torch_state"] = torch.get_rng_state()  # synchronised at each epoch start
    out["padding"] = shuffled.padding

    for split in (False, True):
        for dispatch in (False, True):
            loader = prepare_data_loader(
                DataLoader(data, batch_size=16), strategy, split_batches=split, dispatch_batches=dispatch
            )
            out[("map", split, dispatch)] = (_ids(loader), len(loader), loader.padding)
            stream = prepare_data_loader(
                DataLoader(Stream(99), batch_size=16),
                strategy,
                split_batches=split,
                dispatch_batches=dispatch,
            )
            out[("stream", split, dispatch)] = (_ids(stream), stream.padding)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        presharded = prepare_data_loader(
            DataLoader(data, batch_size=10, sampler=DistributedSampler(data, shuffle=False)), strategy
        )
    out["presharded"] = _ids(presharded)
    out["presharded_warning"] = [str(w.message) for w in caught]
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_processes(_rank, 2)


def _flat(batches: list[list[int]]) -> list[int]:
    return [i for batch in batches for i in batch]


def test_processes_share_one_shuffle_though_seeded_differently(results: list[dict[str, Any]]) -> None:
    for epoch in range(2):
        parts = [_flat(r["shuffled"][epoch]) for r in results]
        padding = results[0]["padding"]
        assert len(parts[0]) == len(parts[1]) == 64
        everything = parts[0] + parts[1]
        assert sorted(set(everything)) == list(range(99)) and len(everything) == 99 + padding
    assert results[0]["shuffled"][0] != results[0]["shuffled"][1], "a new permutation each epoch"
    assert torch.equal(results[0]["torch_state"], results[1]["torch_state"])


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("dispatch", [False, True])
@pytest.mark.parametrize("kind", ["map", "stream"])
def test_every_item_arrives_once_plus_the_announced_repeats(
    results: list[dict[str, Any]], kind: str, split: bool, dispatch: bool
) -> None:
    per_rank = [r[(kind, split, dispatch)] for r in results]
    steps = [len(p[0]) for p in per_rank]
    assert steps[0] == steps[1], "both processes run the same number of steps"
    if kind == "map":
        assert per_rank[0][1] == per_rank[1][1] == steps[0], "len() matches the iteration"
    padding = per_rank[0][-1]
    assert padding == per_rank[1][-1]
    gathered = [i for step in zip(per_rank[0][0], per_rank[1][0]) for batch in step for i in batch]
    assert gathered[: len(gathered) - padding] == list(range(99)), "gathered in order, repeats at the end"
    assert len(gathered) - padding == 99 and padding > 0


def test_sharded_and_dispatched_steps_hold_the_same_items(results: list[dict[str, Any]]) -> None:
    for split in (False, True):
        for rank in range(2):
            sharded = results[rank][("map", split, False)][0]
            dispatched = results[rank][("map", split, True)][0]
            assert sharded[:-1] == dispatched[:-1]  # full steps; the last one is evened out differently


def test_a_distributed_sampler_is_kept(results: list[dict[str, Any]]) -> None:
    assert sorted(_flat(results[0]["presharded"]) + _flat(results[1]["presharded"])) == sorted(
        [*range(99), 0]
    )
    # The Accelerator warns (gather_for_metrics cannot drop its repeats); the data layer just keeps it.
    assert results[0]["presharded_warning"] == []
