"""The Trainer's loaders come from the one data layer: seedable shuffling, sharding rules, pass-through.

Shuffled orders depend only on ``(seed, epoch)``: two fits with the same seed see the same batches
epoch by epoch, the epochs differ, and in two processes the ranks share one permutation even when
seeded differently. A user's ``DistributedSampler`` and ``use_distributed_sampler=False`` leave
the sharding to the user; iterables that are not plain ``DataLoader``s are passed through.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import drivetrain as dt
from drivetrain.data import PassThroughBatches, PreparedDataLoader, SeedableRandomSampler
from drivetrain.strategies import SingleDeviceStrategy
from helpers.multiprocess import run_processes
from trainer.trainer_models import Regression, quiet_trainer


def _indexed(n: int) -> TensorDataset:
    x = torch.arange(n, dtype=torch.float32).unsqueeze(1).repeat(1, 4)
    return TensorDataset(x, x.sum(1, keepdim=True))


class Recorder(Regression):
    """Records the first feature of every training batch (the sample index), epoch by epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[int, list[int]] = {}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen.setdefault(self.current_epoch, []).extend(int(i) for i in batch[0][:, 0])
        return super().training_step(batch, batch_idx)


def _fit_orders(seed: int, **trainer_kwargs: Any) -> tuple[dict[int, list[int]], dt.Trainer]:
    dt.seed_everything(seed)
    model = Recorder()
    trainer = quiet_trainer(max_epochs=3, **trainer_kwargs)
    trainer.fit(model, DataLoader(_indexed(24), batch_size=4, shuffle=True))
    return model.seen, trainer


def test_the_same_seed_gives_the_same_order_epoch_by_epoch() -> None:
    first, trainer = _fit_orders(42)
    again, _ = _fit_orders(42)
    assert first == again
    assert first[0] != first[1] != first[2], "every epoch has its own order"
    assert all(sorted(order) == list(range(24)) for order in first.values())
    assert _fit_orders(43)[0] != first
    # The loader the Trainer iterated goes back to any epoch's order.
    loader = trainer.train_dataloader
    assert isinstance(loader, PreparedDataLoader) and isinstance(loader.sampler, SeedableRandomSampler)
    torch.manual_seed(0)  # whatever was drawn since
    loader.set_epoch(1)
    assert [int(i) for batch in loader for i in batch[0][:, 0]] == first[1]


class OwnIteration(DataLoader):  # type: ignore[type-arg]
    """A DataLoader subclass that changes how it iterates: preparing it would lose that."""

    def __iter__(self) -> Iterator[Any]:
        for x, y in super().__iter__():
            yield x * 0, y * 0


def test_loaders_that_cannot_be_prepared_are_passed_through() -> None:
    seen: list[float] = []

    class Sums(Regression):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            seen.append(float(batch[0].sum()))
            return super().training_step(batch, batch_idx)

    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(Sums(), OwnIteration(_indexed(8), batch_size=4))
    assert isinstance(trainer.train_dataloader, PassThroughBatches)
    assert seen == [0.0, 0.0], "the subclass's own iteration is kept"
    batches = [(torch.ones(2, 4), torch.ones(2, 1))] * 3  # a list of batches
    trainer = quiet_trainer(max_epochs=2)
    trainer.fit(Regression(), batches)
    assert trainer.global_step == 6


def test_a_strategy_that_wraps_the_loaders_still_trains_epoch_after_epoch() -> None:
    class Wrapped:
        def __init__(self, loader: Any) -> None:
            self.loader = loader

        def __iter__(self) -> Iterator[Any]:
            return iter(self.loader)

        def __len__(self) -> int:
            return len(self.loader)

    class Wrapping(SingleDeviceStrategy):
        def process_dataloader(self, dataloader: Any) -> Any:
            return Wrapped(dataloader)

    model = Recorder()
    trainer = quiet_trainer(strategy=Wrapping(), max_epochs=2)
    trainer.fit(model, DataLoader(_indexed(8), batch_size=4, shuffle=True))
    assert trainer.global_step == 4
    assert sorted(model.seen[0]) == sorted(model.seen[1]) == list(range(8)) and model.seen[0] != model.seen[1]


def test_a_list_of_batches_resumes_mid_epoch(tmp_path: Path) -> None:
    batches = [(torch.full((2, 4), float(i)), torch.full((2, 1), float(i))) for i in range(6)]
    seen: list[list[float]] = [[], []]

    class Marks(Regression):
        def __init__(self, run: int) -> None:
            super().__init__()
            self.run = run

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            seen[self.run].append(float(batch[0][0, 0]))
            return super().training_step(batch, batch_idx)

    checkpoint = dt.trainer.ModelCheckpoint(
        dirpath=tmp_path, every_n_train_steps=4, save_top_k=-1, filename="{step}"
    )
    quiet_trainer(max_epochs=2, callbacks=[checkpoint], enable_checkpointing=True).fit(Marks(0), batches)
    quiet_trainer(max_epochs=2).fit(Marks(1), batches, ckpt_path=str(tmp_path / "step=4.ckpt"))
    assert seen[1] == seen[0][4:] == [4.0, 5.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


# -- two processes ------------------------------------------------------------------------------------
def _ddp(**kwargs: Any) -> dt.Trainer:
    return quiet_trainer(strategy="ddp", devices=2, **kwargs)


def _two_processes(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    seen = []
    for _ in range(2):  # two fits, each process seeded differently, the same each time
        dt.seed_everything(100 + rank)
        model = Recorder()
        _ddp(max_epochs=2).fit(model, DataLoader(_indexed(24), batch_size=4, shuffle=True))
        seen.append(model.seen)
    out["seen"] = seen

    data = _indexed(24)
    model = Recorder()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a user's DistributedSampler is respected without a word
        _ddp(max_epochs=1).fit(
            model, DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=False))
        )
    out["distributed_sampler"] = model.seen[0]

    try:
        _ddp(max_epochs=1).fit(Regression(), OwnIteration(data, batch_size=4))
        out["refused"] = ""
    except TypeError as error:
        out["refused"] = str(error)
    dt.seed_everything(0)
    predictions = _ddp().predict(
        Regression(), [DataLoader(data, batch_size=5), DataLoader(_indexed(3), batch_size=2)]
    )
    out["predicted"] = [torch.cat(per_loader) for per_loader in predictions]
    return out


@pytest.mark.multiprocess
def test_two_processes_share_one_seeded_order_and_respect_user_sharding() -> None:
    ranks = run_processes(_two_processes, 2, timeout=120)
    for fit in range(2):
        for epoch in range(2):
            parts = [rank["seen"][fit][epoch] for rank in ranks]
            assert len(parts[0]) == len(parts[1]) == 12
            assert sorted(parts[0] + parts[1]) == list(range(24)), "one permutation, shared out"
    for rank in ranks:
        assert rank["seen"][0] == rank["seen"][1], "the same seed, the same order, epoch by epoch"
        assert rank["seen"][0][0] != rank["seen"][0][1]
    # DistributedSampler(shuffle=False) gives rank r the samples r, r + 2, ...
    assert ranks[0]["distributed_sampler"] == list(range(0, 24, 2))
    assert ranks[1]["distributed_sampler"] == list(range(1, 24, 2))
    assert "OwnIteration, a DataLoader subclass with its own iteration" in ranks[0]["refused"]
    dt.seed_everything(0)
    model = Regression()
    for rank in ranks:  # every sample once, in dataset order, on every rank
        for predicted, data in zip(rank["predicted"], (_indexed(24), _indexed(3))):
            torch.testing.assert_close(predicted, model(data.tensors[0]).detach())


RANDOM_NUMBERS = Path(__file__).parent / "scripts" / "seeded_random_numbers.py"


@pytest.mark.timeout(300)
def test_after_seed_everything_a_module_draws_lightnings_random_numbers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Every training step's torch, Python and NumPy draws equal Lightning 2.6's (one program run on both), with
    and without shuffling and validation, and so does the first draw after fit and after test: the prepared
    loaders draw from torch's global generator what a plain DataLoader draws, and the sanity check leaves the
    generators as it found them. The shuffled order differs by design (docs/migrating-from-lightning.md)."""
    import importlib.util
    import json

    from helpers.peers import lightning_results_file

    theirs = json.loads(
        lightning_results_file(RANDOM_NUMBERS, "seeded-random", request, tmp_path_factory).read_text()
    )
    spec = importlib.util.spec_from_file_location("seeded_random_numbers", RANDOM_NUMBERS)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    ours = script.run_all("drivetrain")
    assert ours.keys() == theirs.keys()
    for case in ours:
        assert [step[:3] for step in ours[case]["steps"]] == [step[:3] for step in theirs[case]["steps"]], (
            case
        )
        assert (ours[case]["after_fit"], ours[case]["after_test"]) == (
            theirs[case]["after_fit"],
            theirs[case]["after_test"],
        )
    for case in ("in_order", "in_order_validated"):  # the batches too, in order
        assert [step[3] for step in ours[case]["steps"]] == [step[3] for step in theirs[case]["steps"]]
