"""The Trainer in 2 real processes joined by gloo (the ranks are forked; each builds its own Trainer).

Every launch checks several things, since starting processes is the expensive part.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.strategies import DDPStrategy
from drivetrain.trainer import EarlyStopping, ModelCheckpoint, OnExceptionCheckpoint
from helpers.multiprocess import run_processes
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data, weights

pytestmark = pytest.mark.multiprocess


def _ddp_trainer(**kwargs: Any) -> dt.Trainer:
    return quiet_trainer(strategy="ddp", devices=2, **kwargs)


class RankScored(Regression):
    """Logs a rank-dependent score without sync_dist, and a synced rank metric."""

    def on_validation_epoch_end(self) -> None:
        self.log(
            "score", float(10 - self.current_epoch + 5 * self.global_rank)
        )  # keeps improving on rank 0 only

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        super().validation_step(batch, batch_idx)
        self.log("rank_mean", float(self.global_rank))


def _fit_evaluate_predict(rank: int, world: int, root: str) -> dict[str, Any]:
    torch.manual_seed(0)
    model = Regression(lr=0.1)
    trainer = _ddp_trainer(max_epochs=2)
    assert (trainer.global_rank, trainer.world_size, trainer.is_global_zero) == (rank, 2, rank == 0)
    # 4 samples per rank and step: rank 0 sees 0-3 and rank 1 sees 4-7 of each block of 8 (whole batches dealt).
    trainer.fit(model, loader(regression_data(64), batch_size=4))
    test_data = regression_data(21, seed=3)
    tested = trainer.test(model, loader(test_data, batch_size=4), verbose=False)
    predictions = trainer.predict(model, loader(test_data, batch_size=4))
    scored = RankScored()
    stopper = EarlyStopping("score", patience=1, mode="min")
    rank_trainer = _ddp_trainer(max_epochs=10, limit_train_batches=2, callbacks=[stopper])
    rank_trainer.fit(scored, loader(), loader(regression_data(10), batch_size=4))
    unsharded = _ddp_trainer(max_epochs=1, use_distributed_sampler=False)
    unsharded.fit(Regression(), loader(regression_data(64), batch_size=4))  # every rank sees all 16 batches

    class EveryOther(torch.utils.data.Sampler[int]):
        def __iter__(self) -> Any:
            return iter(range(0, 64, 2))

        def __len__(self) -> int:
            return 32

    custom = torch.utils.data.DataLoader(regression_data(64), batch_size=4, sampler=EveryOther())
    custom_trainer = _ddp_trainer(max_epochs=1)
    custom_trainer.fit(Regression(), custom)  # a custom sampler's batches are shared out like any others
    # Last (it ends the run with an error): a checkpoint on exception cannot be taken by 2 processes.
    try:
        _ddp_trainer(max_epochs=1, callbacks=[OnExceptionCheckpoint(root)]).fit(Regression(), loader())
        refusal = ""
    except ValueError as error:
        refusal = str(error)
    return {
        "refusal": refusal,
        "unsharded_steps": unsharded.global_step,
        "custom_steps": custom_trainer.global_step,
        "weights": weights(model),
        "steps": trainer.global_step,
        "tested": tested,
        "predictions": torch.cat(predictions),
        "stopped_epoch": rank_trainer.current_epoch,
        "rank_mean": float(rank_trainer.callback_metrics["rank_mean"]),
    }


def test_ddp_fit_evaluate_predict_and_stop_together(tmp_path: Path) -> None:
    ranks = run_processes(_fit_evaluate_predict, 2, args=(str(tmp_path),), timeout=90)
    torch.manual_seed(0)
    model = Regression(lr=0.1)
    single = quiet_trainer(max_epochs=2)
    single.fit(model, loader(regression_data(64), batch_size=8))  # one process, the combined batch
    test_data = regression_data(21, seed=3)
    expected_loss = float(nn.functional.mse_loss(model(test_data.tensors[0]), test_data.tensors[1]).detach())
    for result in ranks:
        assert result["steps"] == single.global_step == 16
        for key, value in weights(model).items():
            torch.testing.assert_close(
                result["weights"][key], value, rtol=1e-5, atol=1e-6
            )  # summation order only
        # Every sample counted once across the ranks (11 + 10), the mean over all 21.
        assert result["tested"][0]["test_count"] == 21.0
        assert result["tested"][0]["test_loss"] == pytest.approx(expected_loss, rel=1e-5)
        torch.testing.assert_close(
            result["predictions"], model(test_data.tensors[0]).detach(), rtol=1e-5, atol=1e-6
        )
        # Rank 0's score improves every epoch, rank 1's never does: rank 0 decides for both.
        assert result["stopped_epoch"] == 10
        # Epoch means are reduced across ranks by default, weighted by batch size: the 3 validation
        # batches (4, 4, 2 items) are dealt out, rank 0 logging 0 for 6 items and rank 1 logging 1 for 4.
        assert result["rank_mean"] == pytest.approx(0.4)
        assert result["unsharded_steps"] == 16
        assert result["custom_steps"] == 4  # EveryOther's 8 batches, 4 per rank
        assert (
            "OnExceptionCheckpoint saves only in single-process runs: with 2 processes" in result["refusal"]
        )
    assert ranks[0]["predictions"].shape[0] == 21


class Preemptible(Regression):
    def __init__(self) -> None:
        super().__init__(dropout=0.2, optimizer="adam", lr=0.01)


def _resume(rank: int, world: int, root: str) -> dict[str, Any]:
    def run(name: str, ckpt_path: str | None) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = Preemptible()
        checkpoint = ModelCheckpoint(
            dirpath=os.path.join(root, name), every_n_train_steps=3, save_top_k=-1, filename="{step}"
        )
        trainer = _ddp_trainer(max_epochs=2, callbacks=[checkpoint], enable_checkpointing=True)
        trainer.fit(model, loader(regression_data(64), batch_size=4, shuffle=True), ckpt_path=ckpt_path)
        return weights(model)

    full = run("full", None)
    resumed = run("resumed", os.path.join(root, "full", "step=9.ckpt"))  # batch 1 of epoch 1
    files = sorted(os.listdir(os.path.join(root, "full")))
    return {"same": all(torch.equal(full[k], resumed[k]) for k in full), "files": files, "weights": full}


def test_ddp_resume_mid_epoch_is_bit_identical(tmp_path: Path) -> None:
    ranks = run_processes(_resume, 2, args=(str(tmp_path),), timeout=90)
    assert [r["same"] for r in ranks] == [True, True]
    assert ranks[0]["files"] == ["step=12.ckpt", "step=15.ckpt", "step=3.ckpt", "step=6.ckpt", "step=9.ckpt"]
    for key in ranks[0]["weights"]:
        assert torch.equal(ranks[0]["weights"][key], ranks[1]["weights"][key])


class CustomPrecisionPlugin(dt.plugins.Precision):
    def __init__(self) -> None:
        self.backward_calls = 0
        self.connected = False

    def backward(self, tensor: torch.Tensor, module: Any, *args: Any, **kwargs: Any) -> None:
        self.backward_calls += 1
        super().backward(tensor, module, *args, **kwargs)

    def connect(self, model: Any, optimizers: Any, lr_schedulers: Any) -> Any:
        self.connected = True
        return super().connect(model, optimizers, lr_schedulers)


class MyCustomDistributedDataParallel(nn.parallel.DistributedDataParallel):
    pass


class CustomDDPStrategy(DDPStrategy):
    """The seed's custom strategy: its own DDP wrapper and a setup that reaches its plugins."""

    def configure_ddp(self) -> None:
        self.model = MyCustomDistributedDataParallel(self.model, device_ids=None)

    def setup(self, trainer: Any) -> None:
        self.accelerator.setup()
        self.precision_plugin.connect(self.model, None, None)


def _seed_custom_strategy(rank: int, world: int) -> dict[str, Any]:
    precision = CustomPrecisionPlugin()
    # As in the seed: no devices given; the launcher (torchrun-like variables here) says how many.
    trainer = dt.Trainer(
        strategy=CustomDDPStrategy(),
        plugins=[precision],
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        max_steps=3,
    )
    model = Regression()
    trainer.fit(model, loader())
    wrapped = type(trainer.model).__name__
    return {
        "wrapped": wrapped,
        "backward": precision.backward_calls,
        "connected": precision.connected,
        "world": trainer.world_size,
        "steps": trainer.global_step,
    }


def test_seed_custom_strategy_and_precision_plugin() -> None:
    ranks = run_processes(_seed_custom_strategy, 2, timeout=60)
    assert (
        ranks
        == [
            {
                "wrapped": "MyCustomDistributedDataParallel",
                "backward": 3,
                "connected": True,
                "world": 2,
                "steps": 3,
            }
        ]
        * 2
    )


class Deferred(Regression):
    """A head built in configure_model: on the meta device under FSDP, then sharded."""

    def __init__(self) -> None:
        super().__init__(optimizer="adam", lr=0.01)

    def configure_model(self) -> None:
        if not hasattr(self, "head"):
            self.head = nn.Linear(1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.net(x))


def _sharded(rank: int, world: int, root: str) -> list[Any]:
    def run(name: str, ckpt_path: str | None) -> tuple[int, float, list[str]]:
        torch.manual_seed(0)
        model = Deferred()
        checkpoint = ModelCheckpoint(
            dirpath=os.path.join(root, name), every_n_train_steps=3, save_top_k=-1, filename="{step}"
        )
        trainer = quiet_trainer(
            strategy="fsdp",
            devices=2,
            max_epochs=2,
            callbacks=[checkpoint],
            enable_checkpointing=True,
            accumulate_grad_batches=2,
            gradient_clip_val=1.0,
        )
        data = loader(regression_data(64), batch_size=4, shuffle=True)
        trainer.fit(model, data, loader(regression_data(16), batch_size=4), ckpt_path=ckpt_path)
        result = trainer.validate(model, loader(regression_data(16), batch_size=4), verbose=False)
        return trainer.global_step, result[0]["val_loss"], sorted(os.listdir(os.path.join(root, name)))

    return [run("full", None), run("resumed", os.path.join(root, "full", "step=3.ckpt"))]


def test_fsdp_through_the_core_contract(tmp_path: Path) -> None:
    """configure_model, accumulation, clipping, sharded checkpoints and a mid-epoch resume under FSDP."""
    for full, resumed in run_processes(_sharded, 2, args=(str(tmp_path),), timeout=120):
        assert full[0] == resumed[0] == 8  # 8 batches per epoch, a step every 2
        assert full[1] == resumed[1]  # the resumed run ends where the uninterrupted one did
        assert full[2] == ["step=3.ckpt", "step=6.ckpt"] and resumed[2] == ["step=6.ckpt"]
