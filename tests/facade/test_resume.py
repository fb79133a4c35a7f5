"""save_state/load_state mid-epoch: the resumed run sees the same batches and ends bit-identical.

The state covers the model, optimizer, scheduler, loss scaler, every process's RNG states, the
data loader's position and registered objects. Dropout makes the RNG matter, a shuffling loader
the position, fp16 (in one process; CPU autocast) the scaler.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt
from drivetrain.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed
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


# -- another number of processes: the data position converts (docs/resuming.md) ----------------------------
def _position_run(directory: str, split: bool, save_after: int | None) -> dict[str, Any]:
    """Iterate one shuffled epoch; save after ``save_after`` steps (and stop), or load ``directory`` first.

    Returns the sample indices of every batch this process saw, and the warnings it gave.
    """
    accelerator = dt.Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(split_batches=split))
    set_seed(0)
    x = torch.randn(64, 4)
    x[:, 0] = torch.arange(64.0)  # the sample's index
    _, loader = accelerator.prepare(
        nn.Linear(4, 1), DataLoader(TensorDataset(x, torch.zeros(64, 1)), batch_size=4, shuffle=True)
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if save_after is None:
            accelerator.load_state(directory)
    seen = []
    for step, (batch, _) in enumerate(loader):
        seen.append([int(i) for i in batch[:, 0].tolist()])
        if step + 1 == save_after:
            accelerator.save_state(directory)
            break
    return {"seen": seen, "warnings": [str(w.message) for w in caught]}


def _positions_rank(rank: int, world_size: int, root: str) -> dict[str, Any]:
    results = {}
    for split in (False, True):
        # Resume what one process saved after 5 steps, then save after 3 (non-split) or 5 (split) steps.
        results[split, "resumed"] = _position_run(f"{root}/one-{split}", split, save_after=None)
        results[split, "saved"] = _position_run(f"{root}/two-{split}", split, save_after=5 if split else 3)
    return results


@pytest.mark.multiprocess
def test_resuming_on_another_number_of_processes_continues_with_the_first_unseen_batch(
    tmp_path: Path,
) -> None:
    """1 -> 2 and 2 -> 1 processes, batches dealt out and batches split (``split_batches=True``)."""
    root = str(tmp_path)
    order = {
        split: _position_run(f"{root}/full-{split}", split, save_after=-1)["seen"] for split in (False, True)
    }
    assert sorted(i for batch in order[False] for i in batch) == list(range(64))  # the epoch's 16 batches
    assert order[True] == order[False]  # one permutation, whatever the splitting
    for split in (False, True):
        _position_run(f"{root}/one-{split}", split, save_after=5)
    ranks = run_processes(_positions_rank, 2, args=(root,), timeout=120)
    warning = "was saved by 1 process(es) and is resumed by 2"
    order_ = order[False]
    # Dealt out, 1 -> 2: 5 batches were seen, so the epoch goes on at step 2 (batches 4 and 5): batch 4 is
    # seen again, none is skipped.
    for rank, result in enumerate(ranks):
        assert result[False, "resumed"]["seen"] == [order_[k] for k in range(4 + rank, 16, 2)]
        # Split, 1 -> 2: a step is one batch whatever the number of processes, so batch 5 comes next.
        halves = [order_[k][2 * rank : 2 * rank + 2] for k in range(5, 16)]
        assert result[True, "resumed"]["seen"] == halves
        assert any(warning in w for w in result[False, "resumed"]["warnings"]) == (rank == 0)
    # 2 -> 1: 3 steps of 2 processes dealt batches 0-5 out; 5 split steps used batches 0-4.
    for split, first_unseen in ((False, 6), (True, 5)):
        resumed = _position_run(f"{root}/two-{split}", split, save_after=None)
        assert resumed["seen"] == order_[first_unseen:]
        assert any("was saved by 2 process(es) and is resumed by 1" in w for w in resumed["warnings"])
