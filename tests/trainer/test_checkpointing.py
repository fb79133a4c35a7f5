"""Checkpoints: a resumed run ends bit-identical to an uninterrupted one; top-k keeps the right files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

import drivetrain as dt
from drivetrain.plugins.io import AsyncCheckpointIO
from drivetrain.trainer import Callback, ModelCheckpoint
from trainer.trainer_models import (
    Regression,
    assert_same_weights,
    loader,
    quiet_trainer,
    regression_data,
    weights,
)


class Recipe(Regression):
    """Adam, a per-step scheduler, dropout (RNG on every step) and an epoch-mean metric."""

    def __init__(self) -> None:
        super().__init__(lr=0.02, dropout=0.3, optimizer="adam")

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("epoch_loss", loss, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.7)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class Crash(Callback):
    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def on_train_batch_end(self, trainer: dt.Trainer, *args: Any) -> None:
        if trainer.global_step == self.at_step:
            raise RuntimeError("simulated preemption")


def _run(
    tmp_path: Path, name: str, ckpt_path: str | None = None, crash_at: int | None = None, **kwargs: Any
) -> tuple[Recipe, dt.Trainer]:
    torch.manual_seed(1)
    model = Recipe()
    callbacks: list[Callback] = [
        ModelCheckpoint(
            dirpath=tmp_path / name, every_n_train_steps=3, save_top_k=-1, save_last=True, filename="{step}"
        )
    ]
    if crash_at is not None:
        callbacks.insert(0, Crash(crash_at))
    trainer = quiet_trainer(max_epochs=3, callbacks=callbacks, enable_checkpointing=True, **kwargs)
    data = loader(regression_data(60), batch_size=8, shuffle=True)  # 8 batches, the last one short
    trainer.fit(model, data, loader(regression_data(16, seed=5)), ckpt_path=ckpt_path)
    return model, trainer


def test_resuming_mid_epoch_is_bit_identical(tmp_path: Path) -> None:
    full_model, full = _run(tmp_path, "full")
    # Resume from a checkpoint in the middle of the second epoch (step 12 = batch 4 of epoch 1).
    resumed_model, resumed = _run(tmp_path, "resumed", ckpt_path=str(tmp_path / "full" / "step=12.ckpt"))
    assert_same_weights(weights(resumed_model), weights(full_model))
    assert resumed.global_step == full.global_step == 24
    for a, b in zip(resumed.optimizers[0].state.values(), full.optimizers[0].state.values()):
        assert torch.equal(a["exp_avg"], b["exp_avg"])
    assert (
        resumed.lr_scheduler_configs[0].scheduler.get_last_lr()
        == full.lr_scheduler_configs[0].scheduler.get_last_lr()
    )
    assert torch.equal(resumed.callback_metrics["epoch_loss"], full.callback_metrics["epoch_loss"])
    assert torch.equal(resumed.callback_metrics["val_loss"], full.callback_metrics["val_loss"])


def test_a_crashed_run_resumes_from_last_and_matches(tmp_path: Path) -> None:
    full_model, _ = _run(tmp_path, "reference")
    with pytest.raises(RuntimeError, match="simulated preemption"):
        _run(tmp_path, "crashy", crash_at=10)  # last.ckpt holds step 9, in epoch 1
    resumed_model, resumed = _run(tmp_path, "crashy", ckpt_path="last")
    assert_same_weights(weights(resumed_model), weights(full_model))
    assert resumed.current_epoch == 3


@pytest.mark.parametrize("snapshot", ["fork", "copy"])
def test_background_saves_hold_the_weights_of_their_step_and_resume_exactly(
    tmp_path: Path, snapshot: str
) -> None:
    """AsyncCheckpointIO forks (copy-on-write) or copies into memory reused from save to save; no save may see another's data."""
    recorded: dict[int, dict[str, torch.Tensor]] = {}

    class Record(Callback):
        def on_train_batch_end(self, trainer: dt.Trainer, module: Any, *args: Any) -> None:
            recorded[trainer.global_step] = weights(module)

    torch.manual_seed(1)
    model = Recipe()
    # Every step a step file and last.ckpt: two saves back to back, the second taken while the
    # first may still be pending, then reused memory for the next step's pair.
    checkpoint = ModelCheckpoint(
        dirpath=tmp_path / "background",
        every_n_train_steps=1,
        save_top_k=-1,
        save_last=True,
        filename="{step}",
    )
    trainer = quiet_trainer(
        max_epochs=3,
        callbacks=[Record(), checkpoint],
        enable_checkpointing=True,
        plugins=[AsyncCheckpointIO(snapshot=snapshot)],
    )
    trainer.fit(
        model, loader(regression_data(60), batch_size=8, shuffle=True), loader(regression_data(16, seed=5))
    )
    assert sorted(recorded) == list(range(1, 25))
    for step, expected in recorded.items():
        saved = torch.load(tmp_path / "background" / f"step={step}.ckpt", weights_only=False)
        assert saved["global_step"] == step
        assert_same_weights(saved["state_dict"], expected)
    last = torch.load(tmp_path / "background" / "last.ckpt", weights_only=False)
    assert_same_weights(last["state_dict"], recorded[24])
    # The optimizer and scheduler state went through the same memory: a synchronous run resumed
    # from a background checkpoint ends where the background run ended.
    resumed_model, _ = _run(tmp_path, "resumed", ckpt_path=str(tmp_path / "background" / "step=12.ckpt"))
    assert_same_weights(weights(resumed_model), weights(model))


def test_a_checkpoint_inside_an_accumulation_window_resumes_exactly(tmp_path: Path) -> None:
    """A save between two optimizer steps (a preemption, or ``save_checkpoint`` from a callback) holds the
    window's gradients so far; the resumed run completes that window as the uninterrupted one did."""
    path = tmp_path / "mid-window.ckpt"

    class SaveMidWindow(Callback):
        def on_train_batch_end(self, trainer: dt.Trainer, *args: Any) -> None:
            # Batch 4 of epoch 1, the second of the window 3-5: the step after batch 5 needs batch 3's gradients.
            if trainer.fit_progress.total_batches_done == 13:
                trainer.save_checkpoint(path)

    def run(ckpt_path: Path | None = None) -> tuple[Recipe, dt.Trainer]:
        torch.manual_seed(1)
        model = Recipe()
        trainer = quiet_trainer(max_epochs=3, accumulate_grad_batches=3, callbacks=[SaveMidWindow()])
        trainer.fit(model, loader(regression_data(60), batch_size=8, shuffle=True), ckpt_path=ckpt_path)
        return model, trainer

    full_model, full = run()
    resumed_model, resumed = run(path)
    assert_same_weights(weights(resumed_model), weights(full_model))
    assert resumed.global_step == full.global_step == 9  # 3 windows per epoch, the last one short


def test_resuming_from_an_epoch_end_checkpoint(tmp_path: Path) -> None:
    torch.manual_seed(1)
    reference = Recipe()
    start = weights(reference)
    data = loader(regression_data(60), batch_size=8, shuffle=True)
    checkpoint = ModelCheckpoint(dirpath=tmp_path, filename="{epoch}", save_top_k=-1)
    trainer = quiet_trainer(max_epochs=3, callbacks=[checkpoint], enable_checkpointing=True)
    trainer.fit(reference, data)
    assert sorted(os.listdir(tmp_path)) == ["epoch=0.ckpt", "epoch=1.ckpt", "epoch=2.ckpt"]
    torch.manual_seed(123)  # a different start: everything must come from the checkpoint
    model = Recipe()
    model.load_state_dict(start)
    trainer = quiet_trainer(max_epochs=3)
    trainer.fit(model, data, ckpt_path=tmp_path / "epoch=0.ckpt")
    assert_same_weights(weights(model), weights(reference))
    assert trainer.global_step == 24


def test_top_k_keeps_the_best_files_and_last(tmp_path: Path) -> None:
    scores = iter([0.5, 0.3, 0.9, 0.1, 0.4, 0.2])

    class Scored(Regression):
        def on_validation_epoch_end(self) -> None:
            self.log("score", next(scores))

    checkpoint = ModelCheckpoint(
        dirpath=tmp_path,
        monitor="score",
        mode="min",
        save_top_k=2,
        save_last=True,
        filename="{epoch}-{score:.1f}",
    )
    trainer = quiet_trainer(max_epochs=6, callbacks=[checkpoint], enable_checkpointing=True)
    trainer.fit(Scored(), loader(), loader())
    assert sorted(os.listdir(tmp_path)) == ["epoch=3-score=0.1.ckpt", "epoch=5-score=0.2.ckpt", "last.ckpt"]
    assert checkpoint.best_model_path == str(tmp_path / "epoch=3-score=0.1.ckpt")
    assert checkpoint.best_model_score == pytest.approx(0.1)
    assert set(checkpoint.best_k_models) == {
        str(tmp_path / "epoch=3-score=0.1.ckpt"),
        str(tmp_path / "epoch=5-score=0.2.ckpt"),
    }
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert saved["epoch"] == 5 and saved["global_step"] == 48
    result = trainer.test(ckpt_path="best", dataloaders=loader(), verbose=False)
    assert result[0]["test_count"] == 64.0


@pytest.mark.parametrize(
    ("mode", "scores", "best"), [("min", [0.5, 0.9, 0.3], 0.3), ("max", [0.5, 0.1, 0.7], 0.7)]
)
def test_a_nan_score_never_ranks_above_a_real_one(
    tmp_path: Path, mode: str, scores: list[float], best: float
) -> None:
    nan = float("nan")
    values = iter([nan, scores[0], nan, scores[1], scores[2], nan])

    class Scored(Regression):
        def on_validation_epoch_end(self) -> None:
            self.log("score", next(values))

    checkpoint = ModelCheckpoint(
        dirpath=tmp_path, monitor="score", mode=mode, save_top_k=2, filename="{epoch}"
    )
    trainer = quiet_trainer(
        max_epochs=6, limit_train_batches=1, callbacks=[checkpoint], enable_checkpointing=True
    )
    trainer.fit(Scored(), loader(), loader())
    # Epoch 0's NaN is kept only while there is room; real scores push NaN ones out and win.
    assert checkpoint.best_model_score is not None and checkpoint.best_model_score.item() == pytest.approx(
        best
    )
    assert checkpoint.best_model_path == str(tmp_path / "epoch=4.ckpt")
    assert sorted(os.listdir(tmp_path)) == ["epoch=1.ckpt", "epoch=4.ckpt"]


def test_max_mode_and_slashes_in_metric_names(tmp_path: Path) -> None:
    class Accuracy(Regression):
        def on_validation_epoch_end(self) -> None:
            self.log("val/acc", float(self.current_epoch))

    checkpoint = ModelCheckpoint(dirpath=tmp_path, monitor="val/acc", mode="max", filename="{val/acc:.0f}")
    trainer = quiet_trainer(max_epochs=3, callbacks=[checkpoint], enable_checkpointing=True)
    trainer.fit(Accuracy(), loader(), loader())
    assert os.listdir(tmp_path) == ["val_acc=2.ckpt"]


def test_default_checkpoint_goes_to_the_logger_version_folder(tmp_path: Path) -> None:
    trainer = dt.Trainer(
        accelerator="cpu",
        max_epochs=2,
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regression(), loader())
    folder = tmp_path / "drivetrain_logs" / "version_0" / "checkpoints"
    assert os.listdir(folder) == ["epoch=1-step=16.ckpt"]
    assert trainer.checkpoint_callback.best_model_path == str(folder / "epoch=1-step=16.ckpt")
    restored = Regression.load_from_checkpoint(folder / "epoch=1-step=16.ckpt")
    assert_same_weights(weights(restored), weights(trainer.training_module))


class _StartingStep(Callback):
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.step = trainer.global_step


def test_last_under_a_new_logger_version_names_the_earlier_runs_checkpoint(tmp_path: Path) -> None:
    # The guide resumed with a second Trainer and ckpt_path="last": that Trainer writes to version_1,
    # finds nothing there, and trained from scratch (to the same epoch count, so nothing showed it).
    def fit(max_epochs: int, ckpt_path: str | None = None) -> tuple[dt.Trainer, int]:
        starting = _StartingStep()
        trainer = quiet_trainer(
            max_epochs=max_epochs,
            default_root_dir=tmp_path,
            logger="csv",
            enable_checkpointing=True,
            callbacks=[starting],
        )
        trainer.fit(Regression(), loader(), ckpt_path=ckpt_path)
        return trainer, starting.step

    fit(2)
    earlier = str(tmp_path / "drivetrain_logs" / "version_0" / "checkpoints" / "epoch=1-step=16.ckpt")
    with pytest.warns(UserWarning) as caught:
        fresh, started_at_step = fit(3, "last")
    message = next(str(w.message) for w in caught if "ckpt_path='last'" in str(w.message))
    assert "version_1/checkpoints') yet; training starts from scratch" in message
    assert f"the newest one is '{earlier}'. Pass ckpt_path='{earlier}' to continue that run" in message
    assert fresh.ckpt_path is None and started_at_step == 0

    resumed, started_at_step = fit(3, earlier)
    assert resumed.ckpt_path == earlier and started_at_step == 16 and resumed.global_step == 24


def test_load_from_checkpoint_uses_saved_hyperparameters_and_overrides(tmp_path: Path) -> None:
    model = Regression(features=4, lr=0.3)
    trainer = quiet_trainer(max_steps=2)
    trainer.fit(model, loader())
    path = tmp_path / "model.ckpt"
    model.trainer.strategy.save_state(path, {"state_dict": model, "hyper_parameters": dict(model.hparams)})
    restored = Regression.load_from_checkpoint(path, lr=0.01)
    assert restored.hparams.lr == 0.01 and restored.hparams.features == 4
    assert_same_weights(weights(restored), weights(model))


def test_hyperparameters_a_checkpoint_cannot_hold_are_left_out_with_a_warning_naming_them(
    tmp_path: Path,
) -> None:
    model = Regression(lr=0.3)
    model.hparams["tokenizer"] = object()  # not a tensor, number, string or container of them
    trainer = quiet_trainer(
        max_steps=2, callbacks=[ModelCheckpoint(dirpath=tmp_path, filename="c")], enable_checkpointing=True
    )
    with pytest.warns(UserWarning, match=r"The hyperparameters 'tokenizer' are objects .* not saved"):
        trainer.fit(model, loader())
    saved = torch.load(tmp_path / "c.ckpt", weights_only=True)["hyper_parameters"]
    assert saved["lr"] == 0.3 and "tokenizer" not in saved


def test_a_custom_checkpoint_io_writes_the_files(tmp_path: Path) -> None:
    from drivetrain.plugins import TorchCheckpointIO

    written: list[str] = []

    class RecordingIO(TorchCheckpointIO):
        def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
            written.append(os.path.basename(path))
            super().save_checkpoint(checkpoint, path, storage_options)

    checkpoint = ModelCheckpoint(dirpath=tmp_path, filename="{epoch}")
    trainer = quiet_trainer(
        max_epochs=2, callbacks=[checkpoint], enable_checkpointing=True, plugins=[RecordingIO()]
    )
    trainer.fit(Regression(), loader())
    assert written == ["epoch=0.ckpt", "epoch=1.ckpt"]
    assert os.listdir(tmp_path) == ["epoch=1.ckpt"]


def test_module_and_callback_checkpoint_hooks_round_trip(tmp_path: Path) -> None:
    class Extra(Regression):
        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            checkpoint["extra"] = {"answer": 42}

        def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            self.loaded = checkpoint["extra"]

    class Counting(Callback):
        def __init__(self) -> None:
            self.batches = 0

        def on_train_batch_end(self, *args: Any) -> None:
            self.batches += 1

        def state_dict(self) -> dict[str, Any]:
            return {"batches": self.batches}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            self.batches = state_dict["batches"]

    checkpoint = ModelCheckpoint(dirpath=tmp_path, filename="{step}", every_n_train_steps=5, save_top_k=-1)
    trainer = quiet_trainer(max_epochs=1, callbacks=[Counting(), checkpoint], enable_checkpointing=True)
    trainer.fit(Extra(), loader())
    counting, model = Counting(), Extra()
    trainer = quiet_trainer(max_epochs=1, callbacks=[counting])
    trainer.fit(model, loader(), ckpt_path=tmp_path / "step=5.ckpt")
    assert model.loaded == {"answer": 42}
    assert counting.batches == 8  # 5 restored + the 3 batches left of the epoch


def test_checkpoint_hooks_see_lightnings_keys_and_what_they_change_is_saved(tmp_path: Path) -> None:
    # Hooks written for Lightning read checkpoint["lr_schedulers"], ["optimizer_states"] and ["state_dict"]
    # as plain states (a KeyError here before), and may change them.
    seen: dict[str, Any] = {}

    class Scheduled(Regression):
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
            return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)]

        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            # The first save (step 4, mid-epoch); at step 8 the epoch scheduler has stepped, as in Lightning.
            seen.setdefault(
                "saved",
                (
                    checkpoint["lr_schedulers"][0]["last_epoch"],
                    checkpoint["optimizer_states"][0]["param_groups"][0]["lr"],
                    sorted(checkpoint["state_dict"]),
                ),
            )
            checkpoint["optimizer_states"][0]["param_groups"][0]["lr"] = 0.5  # saved as changed

        def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            seen["loaded"] = (
                checkpoint["lr_schedulers"][0]["last_epoch"],
                checkpoint["optimizer_states"][0]["param_groups"][0]["lr"],
                checkpoint["epoch"],
                sorted(checkpoint["state_dict"]) == seen["saved"][2],
            )

    class Reader(Callback):  # a callback's hook gets the same dictionary
        def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
            seen["callback"] = len(checkpoint["optimizer_states"]), len(checkpoint["lr_schedulers"])

    checkpoint = ModelCheckpoint(dirpath=tmp_path, filename="{step}", every_n_train_steps=4, save_top_k=-1)
    trainer = quiet_trainer(max_epochs=1, callbacks=[checkpoint, Reader()], enable_checkpointing=True)
    trainer.fit(Scheduled(), loader())
    assert seen["saved"][:2] == (0, 0.1) and "net.0.weight" in seen["saved"][2] and seen["callback"] == (1, 1)
    saved = torch.load(tmp_path / "step=4.ckpt", weights_only=True)
    assert {"optimizer_0", "scheduler_0"} <= saved.keys()
    assert not {"optimizer_states", "lr_schedulers"} & saved.keys()
    assert saved["optimizer_0"]["param_groups"][0]["lr"] == 0.5
    resumed = quiet_trainer(max_epochs=1)
    resumed.fit(Scheduled(), loader(), ckpt_path=tmp_path / "step=4.ckpt")  # resumes mid-epoch
    assert seen["loaded"] == (0, 0.5, 0, True)
    # Evaluation with ckpt_path: the weights are loaded; the saved optimizer and scheduler states are shown.
    resumed.validate(Scheduled(), loader(), ckpt_path=tmp_path / "step=4.ckpt", verbose=False)
    assert seen["loaded"][:3] == (0, 0.5, 0)


def test_evaluating_without_a_model_after_fit_says_it_uses_the_current_weights(tmp_path: Path) -> None:
    # Lightning loads the best checkpoint here; drivetrain runs the current weights, and now says so.
    trainer = quiet_trainer(max_steps=2, default_root_dir=tmp_path, enable_checkpointing=True)
    model = Regression()
    trainer.fit(model, loader())
    best = trainer.checkpoint_callback.best_model_path
    with pytest.warns(
        UserWarning, match=r"Trainer\.test\(\) without a model runs the module's current weights"
    ) as seen:
        trainer.test(dataloaders=loader(), verbose=False)
    assert any(best in str(w.message) and w.filename == __file__ for w in seen)
    with pytest.warns(UserWarning, match=r"Trainer\.predict\(\) without a model") as seen:
        trainer.predict(dataloaders=loader())
    assert any(w.filename == __file__ for w in seen)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer.test(model, loader(), verbose=False)  # a model given: its weights, as asked
        trainer.test(dataloaders=loader(), ckpt_path="best", verbose=False)


class Renamed(Regression):
    """The network renamed since the checkpoint was written (``net`` → ``body``): on_load_checkpoint migrates."""

    def __init__(self) -> None:
        super().__init__()
        self.body = self.net
        del self.net
        self.seen: dict[str, Any] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def configure_optimizers(self) -> Any:
        self.seen["configured_after_hook"] = "keys" in self.seen
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05)
        return {
            "optimizer": optimizer,
            "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.seen["keys"] = set(checkpoint)
        # Nothing is restored yet: the weights are still the fresh ones.
        self.seen["weights_untouched"] = bool(torch.equal(self.body[0].weight, self.fresh))
        state = checkpoint["state_dict"]
        for key in list(state):
            state[key.replace("net.", "body.", 1)] = state.pop(key)
        checkpoint["optimizer_states"][0]["param_groups"][0]["lr"] = 0.01  # a migration of the optimizer
        checkpoint["lr_schedulers"][0]["gamma"] = 0.25


class SeesCheckpoint(Callback):
    def __init__(self, seen: dict[str, Any]) -> None:
        self.seen = seen

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        self.seen["callback_after_module"] = "body.0.weight" in checkpoint["state_dict"]


def test_on_load_checkpoint_migrates_the_whole_checkpoint_before_anything_is_restored(tmp_path: Path) -> None:
    """Lightning's resume order: module, then callbacks see the whole checkpoint (weights, optimizer_states,
    lr_schedulers) before configure_optimizers and before anything is restored, and what they change is loaded."""
    trainer = quiet_trainer(max_epochs=1)
    old = Regression()
    old.configure_optimizers = Renamed.configure_optimizers.__get__(old)  # type: ignore[method-assign]
    old.seen = {}  # type: ignore[assignment]
    trainer.fit(old, loader())
    trainer.save_checkpoint(tmp_path / "old.ckpt")
    saved = {k.replace("net.", "body.", 1): v for k, v in old.state_dict().items()}

    torch.manual_seed(5)
    module = Renamed()
    module.fresh = module.body[0].weight.detach().clone()
    resumed = quiet_trainer(max_epochs=1, callbacks=[SeesCheckpoint(module.seen)])
    resumed.fit(module, loader(), ckpt_path=tmp_path / "old.ckpt")  # max_epochs reached: nothing trains
    assert {"state_dict", "optimizer_states", "lr_schedulers", "callbacks", "loops", "epoch"} <= module.seen[
        "keys"
    ]
    assert module.seen["weights_untouched"] and module.seen["configured_after_hook"]
    assert module.seen["callback_after_module"]
    for key, value in module.state_dict().items():
        torch.testing.assert_close(value, saved[key])
    assert resumed.optimizers[0].param_groups[0]["lr"] == 0.01
    assert resumed.lr_scheduler_configs[0].scheduler.gamma == 0.25

    tested = Renamed()  # evaluation with ckpt_path: the same migration before the weights load
    tested.fresh = tested.body[0].weight.detach().clone()
    quiet_trainer().test(tested, loader(), ckpt_path=tmp_path / "old.ckpt", verbose=False)
    assert tested.seen["weights_untouched"]
    torch.testing.assert_close(tested.body[0].weight, saved["body.0.weight"])


class _SlowWrites(dt.plugins.TorchCheckpointIO):
    """Writes as the built-in IO does, after a pause: a background save is still running when the call returns."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        import time

        time.sleep(0.5)
        super().save_checkpoint(checkpoint, path, storage_options)


def test_an_entry_point_reads_a_checkpoint_an_asynchronous_save_is_still_writing(tmp_path: Path) -> None:
    """save_checkpoint() with AsyncCheckpointIO returns before the file exists; validate(ckpt_path=) waits for it."""
    model = Regression()
    trainer = quiet_trainer(max_epochs=1, plugins=[AsyncCheckpointIO(_SlowWrites())])
    trainer.fit(model, loader(regression_data(16)))
    trainer.save_checkpoint(tmp_path / "after-fit.ckpt")
    validated = trainer.validate(
        model, loader(regression_data(8)), ckpt_path=tmp_path / "after-fit.ckpt", verbose=False
    )
    assert validated and (tmp_path / "after-fit.ckpt").exists()
