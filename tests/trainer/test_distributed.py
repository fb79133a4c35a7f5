"""The Trainer in 2 real processes joined by gloo (the ranks are forked; each builds its own Trainer).

Every launch checks several things, since starting processes is the expensive part.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import drivetrain as dt
from drivetrain.strategies import DDPStrategy
from drivetrain.trainer import Callback, EarlyStopping, ModelCheckpoint, OnExceptionCheckpoint
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


# -- one launch for several promises: hooked steps skip the all-reduce inside an accumulation window,
# -- resuming on another number of processes, a mid-window resume, ranks stopping together ----------
class HookedStep(Regression):
    """Overrides optimizer_step, so the Trainer takes its general (hooked) step path."""

    def optimizer_step(
        self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None
    ) -> None:
        optimizer.step(closure=optimizer_closure)


class GradientsAtBatchEnd(Callback):
    def __init__(self) -> None:
        self.grads: list[torch.Tensor] = []

    def on_train_batch_end(self, trainer: dt.Trainer, module: Any, *args: Any) -> None:
        self.grads.append(module.net[0].weight.grad.detach().clone())


class BatchesSeen(Callback):
    """The sample indices (the first feature) of every training batch, in order."""

    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    def on_train_batch_start(self, trainer: dt.Trainer, module: Any, batch: Any, batch_idx: int) -> None:
        self.seen.append([int(i) for i in batch[0][:, 0].tolist()])


class SaveAtBatch(Callback):
    def __init__(self, path: str, batches: int) -> None:
        self.path, self.batches = path, batches

    def on_train_batch_end(self, trainer: dt.Trainer, *args: Any) -> None:
        if trainer.fit_progress.total_batches_done == self.batches:
            trainer.save_checkpoint(self.path)


def indexed_data() -> TensorDataset:
    """64 samples whose first feature is their index."""
    data = regression_data(64)
    data.tensors[0][:, 0] = torch.arange(64.0)
    return data


def positions_fit(
    ckpt_path: str | None = None, save: SaveAtBatch | None = None, **kwargs: Any
) -> BatchesSeen:
    """One shuffled epoch of 16 batches (in one process), from ``ckpt_path`` if given."""
    torch.manual_seed(0)
    seen = BatchesSeen()
    callbacks: list[Callback] = [seen] if save is None else [seen, save]
    trainer = quiet_trainer(max_epochs=1, callbacks=callbacks, **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Regression(), loader(indexed_data(), batch_size=4, shuffle=True), ckpt_path=ckpt_path)
    seen.warnings = [str(w.message) for w in caught]  # type: ignore[attr-defined]
    return seen


class LocalScore(Regression):
    """A score logged without reduction across processes: rank 0's improves every epoch, rank 1's never."""

    def on_validation_epoch_end(self) -> None:
        self.log("local_score", 10.0 - self.current_epoch if self.global_rank == 0 else 5.0, sync_dist=False)


def _hooks_resumes_and_stopping(rank: int, world: int, root: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    # Accumulating 2 batches per step, with and without an overridden optimizer_step.
    for name, module in (("fast", Regression), ("hooked", HookedStep)):
        torch.manual_seed(0)
        recorder = GradientsAtBatchEnd()
        trainer = _ddp_trainer(max_steps=2, accumulate_grad_batches=2, callbacks=[recorder])
        trainer.fit(module(), loader(regression_data(64), batch_size=4))
        result[name] = recorder.grads
    # Resume what one process saved after 5 batches; save after 3 steps for one process to resume.
    resumed = positions_fit(os.path.join(root, "one.ckpt"), strategy="ddp", devices=2)
    result["resumed_seen"], result["resumed_warnings"] = resumed.seen, resumed.warnings
    positions_fit(save=SaveAtBatch(os.path.join(root, "two.ckpt"), 3), strategy="ddp", devices=2, max_steps=3)

    # Saved inside an accumulation window (batch 4 of 3-batch windows): each process's own gradients.
    def window_run(ckpt_path: str | None) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = Preemptible()
        save = SaveAtBatch(os.path.join(root, "window.ckpt"), 4)
        trainer = _ddp_trainer(max_epochs=2, accumulate_grad_batches=3, callbacks=[save])
        trainer.fit(model, loader(regression_data(64), batch_size=4, shuffle=True), ckpt_path=ckpt_path)
        return weights(model)

    full = window_run(None)
    result["window_same"] = all(
        torch.equal(a, b)
        for a, b in zip(full.values(), window_run(os.path.join(root, "window.ckpt")).values())
    )
    # Last: ranks that stopped apart would leave the other in a collective.
    stopper = EarlyStopping("local_score", patience=1)
    trainer = _ddp_trainer(max_epochs=4, limit_train_batches=2, callbacks=[stopper])
    trainer.fit(LocalScore(), loader(), loader(regression_data(10), batch_size=4))
    result["stopped_epoch"] = trainer.current_epoch
    return result


def test_hooked_no_sync_resuming_on_other_process_counts_mid_window_and_stopping_together(
    tmp_path: Path,
) -> None:
    root = str(tmp_path)
    order = positions_fit().seen  # one process's epoch: 16 shuffled batches
    assert sorted(i for batch in order for i in batch) == list(range(64))
    positions_fit(save=SaveAtBatch(os.path.join(root, "one.ckpt"), 5), max_steps=5)
    ranks = run_processes(_hooks_resumes_and_stopping, 2, args=(root,), timeout=150)
    for name in ("fast", "hooked"):
        # Batches 0 and 2 open a window: the gradients stay local (the ranks saw different data);
        # batches 1 and 3 end one: the all-reduce made them equal.
        first, second = ranks[0][name], ranks[1][name]
        assert [torch.equal(a, b) for a, b in zip(first, second)] == [False, True, False, True], name
    # 1 -> 2 processes: 5 batches were seen, so the epoch goes on at step 2 (batches 4 and 5): batch 4
    # again, none skipped. Rank 0 warns that the run does not repeat the original.
    for rank, result in enumerate(ranks):
        assert result["resumed_seen"] == [order[k] for k in range(4 + rank, 16, 2)]
        assert any("saved by 1 process(es) and is resumed by 2" in w for w in result["resumed_warnings"]) == (
            rank == 0
        )
        assert result["window_same"]
        # Rank 0's score improves every epoch, so neither rank stops early.
        assert result["stopped_epoch"] == 4
    # 2 -> 1: 3 steps of 2 processes used batches 0-5.
    resumed = positions_fit(os.path.join(root, "two.ckpt"))
    assert resumed.seen == order[6:]
    assert any("saved by 2 process(es) and is resumed by 1" in w for w in resumed.warnings)
