"""``Trainer(sync_batchnorm=True)``: batch norms compute their statistics over every process's batch."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from torch import nn

import drivetrain as dt
from helpers.multiprocess import run_processes
from trainer.trainer_models import loader, quiet_trainer, regression_data, weights

DATA = regression_data(64, seed=3)


class BatchNormNet(dt.TrainingModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return nn.functional.mse_loss(self(batch[0]), batch[1])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _train(sync: bool, **settings: Any) -> dict[str, Any]:
    model = BatchNormNet()
    batch_size = settings.pop("batch_size")
    trainer = quiet_trainer(max_epochs=2, sync_batchnorm=sync, **settings)
    trainer.fit(model, loader(DATA, batch_size=batch_size))
    norm = model.net[1]
    return {
        "kind": type(norm).__name__,
        "mean": norm.running_mean.clone(),
        "var": norm.running_var.clone(),
        # FSDP holds its parameters sharded (DTensors): compared by their running statistics only.
        "weights": weights(model) if settings.get("strategy") != "fsdp" else {},
    }


def _rank(rank: int, world_size: int) -> list[dict[str, Any]]:
    runs = [("ddp", True), ("ddp", False), ("fsdp", True)]
    return [_train(sync, strategy=strategy, devices=2, batch_size=8) for strategy, sync in runs]


@pytest.mark.multiprocess
def test_synchronised_batch_norm_on_two_processes_matches_one_process_on_the_whole_batch() -> None:
    # Two processes with batches of 8 (dealt in turn) see in each step the 16 samples one process sees.
    reference = _train(False, batch_size=16)
    results = run_processes(_rank, 2, timeout=110)
    synced, local = [result[0] for result in results], [result[1] for result in results]
    fsdp = [result[2] for result in results]
    assert synced[0]["weights"] and not fsdp[0]["weights"]
    for run, result in enumerate(synced + fsdp):  # ddp rank 0, rank 1, fsdp rank 0, rank 1
        assert result["kind"] == "CPUSyncBatchNorm", run
        torch.testing.assert_close(result["mean"], reference["mean"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(result["var"], reference["var"], rtol=1e-4, atol=1e-5)
        for name, value in result["weights"].items():
            torch.testing.assert_close(value, reference["weights"][name], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(synced[0]["mean"], synced[1]["mean"], rtol=0, atol=1e-6)
    # Without it each process normalises with its own 8 samples: the statistics differ between processes.
    assert local[0]["kind"] == "BatchNorm1d"
    assert not torch.allclose(local[0]["var"], local[1]["var"], rtol=1e-3, atol=1e-4)


def test_one_process_keeps_its_batch_norms_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="drivetrain")
    result = _train(True, batch_size=16)
    assert result["kind"] == "BatchNorm1d"
    assert "sync_batchnorm=True) has no other process to synchronise with" in caplog.text
    with pytest.raises(TypeError, match="sync_batchnorm expects True or False"):
        quiet_trainer(sync_batchnorm="yes")
