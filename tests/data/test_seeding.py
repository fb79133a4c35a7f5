"""Shuffling reproducible per (seed, epoch), and seeded loader workers.

The Accelerate behaviour these follow is ``check_seedable_sampler`` in Accelerate's own test
script: ``set_seed(42)``, three epochs, ``set_seed(42)``, ``set_epoch(0)``, three epochs again
must give the same items. Worker seeding: ``seed_everything(workers=True)`` makes torch,
``random`` and NumPy differ between the workers of a loader and between ranks (even where the
ranks' loaders would hand their workers the same base seeds), and repeat from run to run.
"""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, TensorDataset

import drivetrain as dt
from drivetrain.data import SeedableRandomSampler, WorkerSeeder, epoch_seed, prepare_data_loader
from drivetrain.utils import DataLoaderConfiguration, set_seed
from drivetrain.utils import SeedableRandomSampler as UtilsSeedableRandomSampler
from helpers.multiprocess import run_processes
from helpers.scripts import run_script


def _ids(loader: Any) -> list[int]:
    return [i for batch in loader for i in batch[0].tolist()]


# -- the sampler -------------------------------------------------------------------------------------
def test_the_same_seed_and_epoch_give_the_same_order() -> None:
    assert UtilsSeedableRandomSampler is SeedableRandomSampler
    sampler = SeedableRandomSampler(range(50), data_seed=3)
    epochs = [list(sampler) for _ in range(3)]  # each full iteration moves to the next epoch
    assert sampler.epoch == 3
    assert len({tuple(order) for order in epochs}) == 3, "every epoch has its own order"
    assert all(sorted(order) == list(range(50)) for order in epochs)
    torch.manual_seed(123)  # what was drawn before does not matter
    sampler.set_epoch(1)
    assert list(sampler) == epochs[1]
    assert list(SeedableRandomSampler(range(50), data_seed=3)) == epochs[0], "another sampler, same seed"
    assert list(SeedableRandomSampler(range(50), data_seed=4)) != epochs[0]


def test_the_seed_defaults_to_torchs_and_a_given_generator_is_reseeded() -> None:
    torch.manual_seed(9)
    assert SeedableRandomSampler(range(5)).initial_seed == 9
    generator = torch.Generator().manual_seed(1)
    with_generator = SeedableRandomSampler(range(30), generator=generator, data_seed=5)
    assert list(with_generator) == list(SeedableRandomSampler(range(30), data_seed=5))
    replacement = SeedableRandomSampler(range(30), replacement=True, num_samples=7, data_seed=5)
    assert len(list(replacement)) == 7 and list(replacement) != list(replacement)  # epochs 0, 1


def test_epoch_seeds_do_not_collide_across_seeds() -> None:
    # seed + epoch would give seed 0 at epoch 1 the order of seed 1 at epoch 0.
    assert epoch_seed(0, 1) != epoch_seed(1, 0)
    assert epoch_seed(0, 1, 0) != epoch_seed(0, 1, 1)
    assert epoch_seed(7, 2) == epoch_seed(7, 2) and 0 <= epoch_seed(2**63 + 5, 10**6) < 2**63


def test_bad_input_says_what_is_allowed() -> None:
    with pytest.raises(TypeError, match=r"data_seed must be an int or None, got str '1'"):
        SeedableRandomSampler(range(3), data_seed="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"set_epoch expects an int >= 0, got -1"):
        SeedableRandomSampler(range(3)).set_epoch(-1)


# -- through the Accelerator, one process ------------------------------------------------------------
def _accelerate_check_seedable_sampler(**config: Any) -> tuple[list[int], list[int]]:
    """Accelerate's check_seedable_sampler, on drivetrain."""
    set_seed(42)
    data = TensorDataset(torch.arange(10))
    accelerator = dt.Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(**config))
    loader = accelerator.prepare(DataLoader(data, batch_size=2, shuffle=True))
    original = [i for _ in range(3) for i in _ids(loader)]
    set_seed(42)
    loader.set_epoch(0)
    again = [i for _ in range(3) for i in _ids(loader)]
    return original, again


@pytest.mark.parametrize("use_seedable_sampler", [True, False])
def test_accelerates_check_seedable_sampler(use_seedable_sampler: bool) -> None:
    original, again = _accelerate_check_seedable_sampler(use_seedable_sampler=use_seedable_sampler)
    assert original == again
    assert original[:10] != original[10:20] != original[20:], "epochs differ"


def test_another_data_seed_gives_another_order() -> None:
    first, _ = _accelerate_check_seedable_sampler(use_seedable_sampler=True, data_seed=42)
    other, _ = _accelerate_check_seedable_sampler(use_seedable_sampler=True, data_seed=43)
    assert first != other


def test_a_users_generator_is_kept_unless_use_seedable_sampler_says_otherwise() -> None:
    data = TensorDataset(torch.arange(20))

    def two_epochs_then_epoch_0(use_seedable_sampler: bool) -> tuple[list[int], list[int], Any]:
        accelerator = dt.Accelerator(
            cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=use_seedable_sampler)
        )
        generator = torch.Generator().manual_seed(0)
        loader = accelerator.prepare(DataLoader(data, batch_size=5, shuffle=True, generator=generator))
        first = _ids(loader)
        _ids(loader)
        loader.set_epoch(0)
        return first, _ids(loader), loader.batch_sampler.batch_sampler.sampler

    first, again, sampler = two_epochs_then_epoch_0(use_seedable_sampler=False)
    assert type(sampler) is RandomSampler and first != again, "the user's generator runs on"
    first, again, sampler = two_epochs_then_epoch_0(use_seedable_sampler=True)
    assert isinstance(sampler, SeedableRandomSampler) and first == again


def test_the_users_loader_is_left_as_it_was() -> None:
    original = DataLoader(TensorDataset(torch.arange(8)), batch_size=4, shuffle=True)
    sampler, batch_sampler = original.sampler, original.batch_sampler
    prepared = prepare_data_loader(original, dt.connect(accelerator="cpu"))
    assert original.sampler is sampler and original.batch_sampler is batch_sampler
    assert sampler.generator is None and type(batch_sampler) is BatchSampler
    assert isinstance(prepared.sampler, SeedableRandomSampler)


# -- worker seeding ------------------------------------------------------------------------------------
class Draws(Dataset):  # type: ignore[type-arg]
    """Each item: its index, the worker that loaded it, and one draw from torch, random and NumPy."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[int, int, float, float, float]:
        worker = torch.utils.data.get_worker_info()
        return index, worker.id, float(torch.rand(())), random.random(), float(np.random.rand())


def _first_draws_per_worker(loader: Any) -> dict[int, tuple[float, float, float]]:
    """Worker id -> (torch, random, NumPy) of its first item."""
    draws: dict[int, tuple[float, float, float]] = {}
    for _, workers, torch_draws, python_draws, numpy_draws in loader:
        worker = int(workers[0])
        draws.setdefault(worker, (float(torch_draws[0]), float(python_draws[0]), float(numpy_draws[0])))
    return draws


def _user_init(worker_id: int) -> None:
    torch.utils.data.get_worker_info().dataset.user_init_ran = True  # type: ignore[union-attr]


class CheckedDraws(Draws):
    user_init_ran = False

    def __getitem__(self, index: int) -> tuple[int, int, float, float, float]:
        assert self.user_init_ran, "the user's worker_init_fn runs after drivetrain's"
        return super().__getitem__(index)


def _prepared_worker_draws(strategy: Any, generator: torch.Generator | None = None) -> dict[int, Any]:
    loader = DataLoader(
        CheckedDraws(), batch_size=2, num_workers=2, worker_init_fn=_user_init, generator=generator
    )
    return _first_draws_per_worker(prepare_data_loader(loader, strategy))


def test_seed_everything_with_workers_seeds_every_generator_of_every_worker() -> None:
    strategy = dt.connect(accelerator="cpu")
    dt.seed_everything(7, workers=True)
    draws = _prepared_worker_draws(strategy)
    assert sorted(draws) == [0, 1]
    for kind, name in enumerate(("torch", "random", "NumPy")):
        assert draws[0][kind] != draws[1][kind], f"{name} draws the same numbers in both workers"
    dt.seed_everything(7, workers=True)
    assert _prepared_worker_draws(strategy) == draws, "two runs with the same seed agree"


def test_without_the_request_the_users_worker_init_fn_is_left_alone() -> None:
    dt.seed_everything(7)
    loader = DataLoader(Draws(), batch_size=2, num_workers=2, worker_init_fn=_user_init)
    prepared = prepare_data_loader(loader, dt.connect(accelerator="cpu"))
    assert prepared.worker_init_fn is _user_init
    dt.seed_everything(7, workers=True)
    seeded = prepare_data_loader(loader, dt.connect(accelerator="cpu"))
    assert isinstance(seeded.worker_init_fn, WorkerSeeder) and seeded.worker_init_fn.user_fn is _user_init
    in_process = prepare_data_loader(DataLoader(Draws(), batch_size=2), dt.connect(accelerator="cpu"))
    assert in_process.worker_init_fn is None  # no workers: nothing to seed


# -- two processes, through the Accelerator ------------------------------------------------------------
def _two_processes(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    dt.seed_everything(100 + rank)  # the processes are seeded differently
    original, again = _accelerate_check_seedable_sampler(use_seedable_sampler=True)
    out["orders"] = (original, again)
    accelerator = dt.Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True)
    )
    prepared = accelerator.prepare(DataLoader(list(range(10)), batch_size=1, shuffle=True))
    out["sampler"] = type(
        prepared.batch_sampler.batch_sampler.sampler
    ).__name__  # as Accelerate's script asks
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = TensorDataset(torch.arange(10))
        sharded = torch.utils.data.DistributedSampler(data, shuffle=False)
        accelerator.prepare(DataLoader(data, batch_size=2, sampler=sharded))
    out["distributed_sampler_warning"] = [str(w.message) for w in caught]
    # A position saved after one step, for a one-process resume.
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(10)), batch_size=2, shuffle=True))
    iterator = iter(loader)
    first = next(iterator)[0].tolist()
    state = loader.state_dict()
    out["position"] = (first, [batch[0].tolist() for batch in iterator], state)
    return out


@pytest.mark.multiprocess
def test_two_processes_agree_on_each_epochs_order() -> None:
    ranks = run_processes(_two_processes, 2, timeout=90)
    for rank in ranks:
        original, again = rank["orders"]
        assert original == again, "set_seed(42); set_epoch(0) repeats the epochs"
        assert len(original) == 18 and original[:6] != original[6:12], "3 epochs of 3 batches, all differ"
        assert rank["sampler"] == "SeedableRandomSampler"
    for epoch in range(3):
        parts = [rank["orders"][0][epoch * 6 : (epoch + 1) * 6] for rank in ranks]
        # 5 batches of 2 dealt to 2 ranks: the sixth repeats the first to even them out.
        assert sorted(set(parts[0] + parts[1])) == list(range(10)), "one permutation, shared out"
        assert parts[0][:2] == parts[1][4:], "the repeats are the epoch's first batch"
    assert any("already uses a DistributedSampler" in m for m in ranks[0]["distributed_sampler_warning"])

    # Resumed by one process: the epoch continues with the first batch no process had yet.
    (_, rest0, state), (_, rest1, _) = ranks[0]["position"], ranks[1]["position"]
    resumed = prepare_data_loader(
        DataLoader(TensorDataset(torch.arange(10)), batch_size=2, shuffle=True), dt.connect(accelerator="cpu")
    )
    resumed.load_state_dict(state)
    assert [batch[0].tolist() for batch in resumed] == [rest0[0], rest1[0], rest0[1]]


@pytest.mark.multiprocess
@pytest.mark.parametrize("door", ["accelerator", "trainer"])
def test_the_workers_of_two_ranks_draw_different_numbers(door: str) -> None:
    """Worker processes cannot start inside the test's rank processes: a real two-process program."""
    result = run_script([str(Path(__file__).parent / "scripts" / "seeded_workers.py"), door], timeout=120)
    assert result.returncode == 0, result.stderr
    ranks = {line["rank"]: line["draws"] for line in map(json.loads, result.stdout.splitlines())}
    assert sorted(ranks) == [0, 1]
    for worker in ("0", "1"):
        for kind, name in enumerate(("torch", "random", "NumPy")):
            assert ranks[0][worker][kind] != ranks[1][worker][kind], f"{name}: worker {worker} of both ranks"
        assert ranks[0][worker] != ranks[0]["1" if worker == "0" else "0"]
