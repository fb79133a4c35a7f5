"""One checkpoint schema: a Trainer checkpoint and an Accelerator save_state differ only in what each door adds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.trainer import ModelCheckpoint
from helpers.multiprocess import run_processes
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data

CORE = {"drivetrain", "state_dict", "optimizer_0", "scheduler_0", "precision", "processes"}
TRAINER_ADDS = {"epoch", "global_step", "hyper_parameters", "loops", "callbacks", "results"}
ACCELERATOR_ADDS = {"custom_0", "accumulation_step", "iteration"}


class WithScheduler(Regression):
    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 2)}


class Counter:
    def __init__(self) -> None:
        self.count = 3

    def state_dict(self) -> dict[str, int]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.count = state["count"]


def _both_doors(folder: Path, devices: int = 1) -> tuple[dict[str, Any], dict[str, Any]]:
    torch.manual_seed(0)
    trainer = quiet_trainer(
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_steps=2,
        enable_checkpointing=True,
        callbacks=[ModelCheckpoint(dirpath=folder / "trainer", filename="c")],
    )
    trainer.fit(WithScheduler(), loader(regression_data(32), batch_size=4))
    accelerator = dt.Accelerator(cpu=True)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 2)
    data = loader(regression_data(32), batch_size=4)
    model, optimizer, scheduler, data = accelerator.prepare(model, optimizer, scheduler, data)
    accelerator.register_for_checkpointing(Counter())
    accelerator.save_state(folder / "accelerator")
    return (
        torch.load(folder / "trainer" / "c.ckpt", weights_only=True),
        torch.load(folder / "accelerator" / "state.ckpt", weights_only=True),
    )


def test_both_doors_write_the_same_core_entries(tmp_path: Path) -> None:
    from_trainer, from_accelerator = _both_doors(tmp_path)
    assert set(from_trainer) == CORE | TRAINER_ADDS
    assert set(from_accelerator) == CORE | ACCELERATOR_ADDS
    for checkpoint, door in ((from_trainer, "trainer"), (from_accelerator, "accelerator")):
        meta = checkpoint["drivetrain"]
        assert meta["format"] == 1 and meta["door"] == door and meta["world_size"] == 1
        assert meta["counts"] == {"models": 1, "optimizers": 1, "schedulers": 1}
        assert [set(record) for record in checkpoint["processes"]] == [{"rng", "dataloaders"}]
        assert set(checkpoint["processes"][0]["rng"]) >= {"python", "torch"}
        assert set(checkpoint["scheduler_0"]) == set(
            torch.optim.lr_scheduler.StepLR(
                torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=1), 2
            ).state_dict()
        )
    assert from_trainer["state_dict"].keys() == {"net.0.weight", "net.0.bias", "net.3.weight", "net.3.bias"}
    assert from_accelerator["state_dict"].keys() == {"weight", "bias"}
    assert len(from_accelerator["processes"][0]["dataloaders"]) == 1


def test_a_weights_only_trainer_checkpoint_holds_the_core_metadata_and_weights(tmp_path: Path) -> None:
    trainer = quiet_trainer(
        max_steps=2,
        enable_checkpointing=True,
        callbacks=[ModelCheckpoint(dirpath=tmp_path, filename="w", save_weights_only=True)],
    )
    trainer.fit(Regression(), loader(regression_data(32)))
    checkpoint = torch.load(tmp_path / "w.ckpt", weights_only=True)
    assert set(checkpoint) == {"drivetrain", "state_dict", "epoch", "global_step", "hyper_parameters"}
    with pytest.raises(ValueError, match="holds no training state"):
        quiet_trainer(max_steps=4).fit(
            Regression(), loader(regression_data(32)), ckpt_path=tmp_path / "w.ckpt"
        )


def test_resuming_with_other_objects_names_the_counts_in_both_doors(tmp_path: Path) -> None:
    _both_doors(tmp_path)

    class TwoSchedulers(Regression):
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.05)
            return [optimizer], [
                torch.optim.lr_scheduler.StepLR(optimizer, 2),
                torch.optim.lr_scheduler.StepLR(optimizer, 3),
            ]

    with pytest.raises(ValueError, match=r"saved with 1 schedulers \(now: 2\)"):
        quiet_trainer(max_steps=4).fit(
            TwoSchedulers(), loader(regression_data(32)), ckpt_path=tmp_path / "trainer" / "c.ckpt"
        )
    accelerator = dt.Accelerator(cpu=True)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    accelerator.prepare(model, optimizer)
    with pytest.raises(ValueError, match=r"holds 1 schedulers \(now: 0\)"):
        accelerator.load_state(tmp_path / "accelerator")


def _two_processes(rank: int, world_size: int, folder: str) -> list[tuple[int, int]]:
    checkpoints = _both_doors(Path(folder), devices=world_size)
    return [(len(c["processes"]), c["drivetrain"]["world_size"]) for c in checkpoints]


@pytest.mark.multiprocess
def test_every_process_contributes_its_record_in_both_doors(tmp_path: Path) -> None:
    results = run_processes(_two_processes, 2, args=(str(tmp_path),), timeout=100)
    assert results == [[(2, 2), (2, 2)], [(2, 2), (2, 2)]]
