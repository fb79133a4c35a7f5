"""save_state/load_state mid-epoch: the resumed run sees the same batches and ends bit-identical.

The state covers the model, optimizer, scheduler, loss scaler, every process's RNG states, the
data loader's position and registered objects. Dropout makes the RNG matter, a shuffling loader
the position, fp16 (in one process; CPU autocast) the scaler.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt
from drivetrain.utils import ProjectConfiguration, set_seed
from helpers.multiprocess import run_processes

SAVE_AT = (1, 2)  # epoch, batch: the 15th batch, which ends a window of 3
MID_WINDOW = (1, 3)  # the 16th: the first of a window of 3
EPOCHS = 3


class Progress:
    """A user object registered for checkpointing."""

    def __init__(self) -> None:
        self.epoch = 0
        self.seen: list[list[int]] = []

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = state["epoch"]


def _run(
    directory: str, resume: bool, save_at: tuple[int, int] = SAVE_AT, **accelerator_kwargs: Any
) -> dict[str, Any]:
    accelerator = dt.Accelerator(cpu=True, **accelerator_kwargs)
    set_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    generator = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(48, 4, generator=generator), torch.randn(48, 1, generator=generator))
    loader = DataLoader(data, batch_size=4, shuffle=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    if resume:
        accelerator.load_state(directory)
    batches_after_save: list[list[float]] = []
    saved_at_step = None
    while progress.epoch < EPOCHS:
        for index, (x, y) in enumerate(loader):
            if resume or (progress.epoch, index) > save_at:
                batches_after_save.append(x[:, 0].tolist())
            with accelerator.accumulate(model):
                accelerator.backward(nn.functional.mse_loss(model(x), y))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if not resume and (progress.epoch, index) == save_at:
                accelerator.save_state(directory)
                saved_at_step = accelerator.step
        progress.epoch += 1
    return {
        "weights": {k: v.clone() for k, v in accelerator.unwrap_model(model).state_dict().items()},
        "batches": batches_after_save,
        "lr": scheduler.get_last_lr(),
        "scale": accelerator.strategy.precision.state_dict(),
        "next_random": torch.rand(3),
        "saved_at_step": saved_at_step,
    }


def _assert_identical(uninterrupted: dict[str, Any], resumed: dict[str, Any]) -> None:
    assert resumed["batches"] == uninterrupted["batches"]
    for name, value in uninterrupted["weights"].items():
        assert torch.equal(resumed["weights"][name], value), name
    assert resumed["lr"] == uninterrupted["lr"]
    assert resumed["scale"] == uninterrupted["scale"]
    assert torch.equal(resumed["next_random"], uninterrupted["next_random"])


def test_one_process_with_fp16_and_accumulation_resumes_exactly(tmp_path: Path) -> None:
    options = {"mixed_precision": "fp16", "gradient_accumulation_steps": 3}
    uninterrupted = _run(str(tmp_path / "state"), resume=False, **options)
    assert uninterrupted["scale"]["scaler"]["scale"] > 0
    _assert_identical(uninterrupted, _run(str(tmp_path / "state"), resume=True, **options))


def test_a_state_saved_inside_an_accumulation_window_resumes_exactly(tmp_path: Path) -> None:
    # Batch 16 of 3-batch windows: the state holds one batch's gradients that the window's step needs.
    options = {"gradient_accumulation_steps": 3}
    uninterrupted = _run(str(tmp_path / "state"), resume=False, save_at=MID_WINDOW, **options)
    assert uninterrupted["saved_at_step"] % 3 == 1  # one batch into its window
    _assert_identical(
        uninterrupted, _run(str(tmp_path / "state"), resume=True, save_at=MID_WINDOW, **options)
    )


def _rank(rank: int, world_size: int, directory: str, resume: bool) -> dict[str, Any]:
    return _run(directory, resume, save_at=MID_WINDOW, gradient_accumulation_steps=3)


@pytest.mark.multiprocess
def test_two_processes_resume_exactly(tmp_path: Path) -> None:
    """Inside an accumulation window, where each process holds gradients the others do not have."""
    directory = str(tmp_path / "state")
    uninterrupted = run_processes(_rank, 2, args=(directory, False))
    resumed = run_processes(_rank, 2, args=(directory, True))
    for before, after in zip(uninterrupted, resumed):
        _assert_identical(before, after)
    assert uninterrupted[0]["batches"] != uninterrupted[1]["batches"], "each process resumed its own shard"


def test_automatic_checkpoint_names_and_limit(tmp_path: Path) -> None:
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2)
    accelerator = dt.Accelerator(cpu=True, project_config=config)
    model = accelerator.prepare(nn.Linear(2, 2))
    written = [accelerator.save_state() for _ in range(3)]
    assert [Path(p).name for p in written] == ["checkpoint_0", "checkpoint_1", "checkpoint_2"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint_1", "checkpoint_2"]
    with torch.no_grad():
        model.weight.zero_()
    assert Path(accelerator.load_state()).name == "checkpoint_2"
    assert model.weight.abs().sum() > 0 and accelerator.save_iteration == 3
    with pytest.raises(ValueError, match="save_state\\(\\) needs a directory"):
        dt.Accelerator(cpu=True).save_state()
    with pytest.raises(FileNotFoundError, match="No drivetrain training state"):
        accelerator.load_state(tmp_path)


def test_loading_a_state_with_more_models_than_prepared_is_an_error(tmp_path: Path) -> None:
    saver = dt.Accelerator(cpu=True)
    first, second = nn.Linear(2, 2), nn.Linear(2, 2)
    saver.prepare(first, second, torch.optim.SGD(first.parameters(), lr=0.1))
    saver.save_state(tmp_path / "state")

    loader = dt.Accelerator(cpu=True)
    model = nn.Linear(2, 2)
    loader.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(
        ValueError, match=r"holds 2 models \(now: 1\): loading it would leave 'state_dict_1' unrestored"
    ):
        loader.load_state(tmp_path / "state")


def test_save_state_refuses_to_leave_out_an_optimizer_that_was_not_prepared(tmp_path: Path) -> None:
    accelerator = dt.Accelerator(cpu=True)
    model = nn.Linear(2, 2)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    forgotten = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    forgotten.step()
    with pytest.raises(
        ValueError, match=r"save_state\(\) would leave out Adam: it holds parameters of a prepared"
    ):
        accelerator.save_state(tmp_path / "state")
    accelerator.register_for_checkpointing(forgotten)
    accelerator.save_state(tmp_path / "state")  # registered: saved, so nothing is left out
