"""ModelCheckpoint never writes over a file it should keep; when it saves; checkpoints on exception."""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from drivetrain.trainer import Callback, EarlyStopping, ModelCheckpoint, OnExceptionCheckpoint
from trainer.trainer_models import (
    Regression,
    assert_same_weights,
    loader,
    quiet_trainer,
    regression_data,
    weights,
)


class Scripted(Regression):
    """Validation reports the next score of a script; the weights at each validation are recorded by score."""

    def __init__(self, scores: list[float]) -> None:
        super().__init__()
        self.scores = scores
        self.weights_at: dict[float, dict[str, torch.Tensor]] = {}

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        score = self.scores[self.trainer.fit_progress.validations_run - 1]
        self.log("score", score)
        self.weights_at[score] = {k: v.detach().clone() for k, v in self.state_dict().items()}


def _saved_weights(path: str | Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["state_dict"]


def _fit(tmp_path: Path, checkpoint: ModelCheckpoint, scores: list[float], **kwargs: Any) -> Scripted:
    model = Scripted(scores)
    settings: dict[str, Any] = {"max_epochs": 1, "val_check_interval": 0.5}
    settings.update(kwargs)
    trainer = quiet_trainer(callbacks=[checkpoint], enable_checkpointing=True, **settings)
    trainer.fit(model, loader(), loader(batch_size=64))
    return model


def test_a_worse_second_validation_in_the_same_epoch_keeps_the_better_file(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path, filename="{epoch}", monitor="score")
    model = _fit(tmp_path, checkpoint, [1.0, 2.0])  # the epoch's second validation is worse
    assert checkpoint.best_model_score == 1.0
    assert checkpoint.best_model_path == str(tmp_path / "epoch=0.ckpt")
    assert sorted(os.listdir(tmp_path)) == ["epoch=0.ckpt"]
    assert_same_weights(_saved_weights(checkpoint.best_model_path), model.weights_at[1.0])


def test_a_better_second_validation_gets_a_version_and_both_hold_their_weights(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path, filename="{epoch}", monitor="score", save_top_k=-1)
    model = _fit(tmp_path, checkpoint, [2.0, 1.0, 3.0, 0.5], max_epochs=2)
    assert sorted(os.listdir(tmp_path)) == [
        "epoch=0-v1.ckpt",
        "epoch=0.ckpt",
        "epoch=1-v1.ckpt",
        "epoch=1.ckpt",
    ]
    for path, score in checkpoint.best_k_models.items():
        assert_same_weights(_saved_weights(path), model.weights_at[float(score)])
    assert (checkpoint.best_model_path, float(checkpoint.best_model_score)) == (  # type: ignore[arg-type]
        str(tmp_path / "epoch=1-v1.ckpt"),
        0.5,
    )

    # top 1: the better checkpoint displaces the kept one and may take its name.
    top1 = ModelCheckpoint(dirpath=tmp_path / "top1", filename="{epoch}", monitor="score")
    model = _fit(tmp_path, top1, [2.0, 1.0])
    assert sorted(os.listdir(tmp_path / "top1")) == ["epoch=0.ckpt"]
    assert top1.best_model_score == 1.0
    assert_same_weights(_saved_weights(top1.best_model_path), model.weights_at[1.0])


def test_without_the_version_counter_a_name_is_reused(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(
        dirpath=tmp_path, filename="{epoch}", monitor="score", save_top_k=-1, enable_version_counter=False
    )
    model = _fit(tmp_path, checkpoint, [2.0, 1.0])
    assert sorted(os.listdir(tmp_path)) == ["epoch=0.ckpt"]
    assert {path: float(score) for path, score in checkpoint.best_k_models.items()} == {
        str(tmp_path / "epoch=0.ckpt"): 1.0
    }  # the score of what the file holds
    assert_same_weights(_saved_weights(checkpoint.best_model_path), model.weights_at[1.0])


def test_a_second_run_into_the_same_folder_keeps_the_first_runs_files(tmp_path: Path) -> None:
    def run() -> tuple[Regression, ModelCheckpoint]:
        checkpoint = ModelCheckpoint(dirpath=tmp_path, filename="{epoch}", save_top_k=-1, save_last=True)
        model = Regression()
        quiet_trainer(max_epochs=2, callbacks=[checkpoint], enable_checkpointing=True).fit(model, loader())
        return model, checkpoint

    first_model, _ = run()
    before = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}
    assert sorted(before) == ["epoch=0.ckpt", "epoch=1.ckpt", "last.ckpt"]
    second_model, second = run()
    assert {name: (tmp_path / name).read_bytes() for name in before} == before
    assert sorted(os.listdir(tmp_path)) == sorted(
        [*before, "epoch=0-v1.ckpt", "epoch=1-v1.ckpt", "last-v1.ckpt"]
    )
    assert second.last_model_path == str(tmp_path / "last-v1.ckpt")
    assert_same_weights(_saved_weights(second.last_model_path), weights(second_model))
    assert_same_weights(_saved_weights(tmp_path / "last.ckpt"), weights(first_model))

    # "last" means the newest run's last checkpoint.
    fresh = ModelCheckpoint(dirpath=tmp_path, filename="{epoch}", save_top_k=-1, save_last=True)
    resumed = quiet_trainer(max_epochs=3, callbacks=[fresh], enable_checkpointing=True)
    resumed.fit(Regression(), loader(), ckpt_path="last")
    assert resumed.ckpt_path == str(tmp_path / "last-v1.ckpt")
    assert fresh.last_model_path == str(tmp_path / "last-v1.ckpt")  # its own last, rewritten
    assert "last-v2.ckpt" not in os.listdir(tmp_path)


class Files(Callback):
    """Which checkpoint files exist after each epoch."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.after_epoch: list[list[str]] = []

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.after_epoch.append(sorted(os.listdir(self.folder)) if self.folder.exists() else [])


@pytest.mark.parametrize(
    ("kwargs", "trainer_kwargs", "expected"),
    [
        # unset: validation twice per epoch -> save after each validation
        (
            {},
            {"val_check_interval": 0.5},
            ["epoch=0-step=4", "epoch=0-step=8", "epoch=1-step=12", "epoch=1-step=16"],
        ),
        # unset, validation every other epoch -> save after those validations only (a fresh score)
        ({}, {"check_val_every_n_epoch": 2}, ["epoch=1-step=16"]),
        # unset, validation once per epoch -> at the epoch end
        ({}, {}, ["epoch=0-step=8", "epoch=1-step=16"]),
        (
            {"save_on_train_epoch_end": True},
            {"val_check_interval": 0.5},
            ["epoch=0-step=8", "epoch=1-step=16"],
        ),
        ({"save_on_train_epoch_end": False}, {"check_val_every_n_epoch": 2}, ["epoch=1-step=16"]),
        ({"every_n_train_steps": 3}, {"accumulate_grad_batches": 2}, ["epoch=0-step=3", "epoch=1-step=6"]),
        ({"every_n_epochs": 2}, {}, ["epoch=1-step=16"]),
    ],
)
def test_when_it_saves(
    tmp_path: Path, kwargs: dict[str, Any], trainer_kwargs: dict[str, Any], expected: list[str]
) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, **kwargs)
    trainer = quiet_trainer(max_epochs=2, callbacks=[checkpoint], enable_checkpointing=True, **trainer_kwargs)
    trainer.fit(Regression(), loader(), loader())
    assert sorted(os.listdir(tmp_path)) == [name + ".ckpt" for name in expected]


def test_train_time_interval_saves_when_the_time_has_passed(tmp_path: Path) -> None:
    # A microsecond passes during every batch: each batch is due (no sleeping needed).
    checkpoint = ModelCheckpoint(
        dirpath=tmp_path, save_top_k=-1, train_time_interval=datetime.timedelta(microseconds=1)
    )
    files = Files(tmp_path)
    quiet_trainer(max_epochs=2, callbacks=[checkpoint, files], enable_checkpointing=True).fit(
        Regression(), loader()
    )
    assert len(os.listdir(tmp_path)) == 16  # no epoch-end checkpoints besides: one schedule
    assert len(files.after_epoch[0]) == 8

    never = ModelCheckpoint(dirpath=tmp_path / "never", train_time_interval=datetime.timedelta(days=1))
    quiet_trainer(max_epochs=1, callbacks=[never], enable_checkpointing=True).fit(Regression(), loader())
    assert not (tmp_path / "never").exists()


def test_schedule_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="these schedules exclude each other"):
        ModelCheckpoint(every_n_train_steps=2, train_time_interval=datetime.timedelta(minutes=1))
    with pytest.raises(ValueError, match="these schedules exclude each other"):
        ModelCheckpoint(every_n_epochs=2, train_time_interval=datetime.timedelta(minutes=1))
    with pytest.raises(ValueError, match=r"positive datetime\.timedelta"):
        ModelCheckpoint(train_time_interval=30)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="save_on_train_epoch_end"):
        ModelCheckpoint(save_on_train_epoch_end="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="enable_version_counter"):
        ModelCheckpoint(enable_version_counter=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"save_last='link'.*needs a local folder; dirpath=memory://runs/c"):
        ModelCheckpoint(dirpath="memory://runs/c", save_last="link")
    with pytest.raises(TypeError, match="save_last"):
        ModelCheckpoint(save_last="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="without folders or extension"):
        OnExceptionCheckpoint(".", filename="a.ckpt")


def test_saving_after_validation_without_validation_warns(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpts", save_on_train_epoch_end=False)
    trainer = quiet_trainer(max_epochs=1, callbacks=[checkpoint], enable_checkpointing=True)
    with pytest.warns(UserWarning, match="this fit has no validation"):
        trainer.fit(Regression(), loader())
    assert not (tmp_path / "ckpts").exists()


class FailAt(Callback):
    def __init__(self, epoch: int, batch: int) -> None:
        self.at = (epoch, batch)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if (trainer.current_epoch, batch_idx) == self.at:
            raise KeyboardInterrupt


def test_checkpoints_on_exception_resume_like_an_uninterrupted_run(tmp_path: Path) -> None:
    def fit(callbacks: list[Callback], ckpt_path: str | None = None) -> tuple[Regression, Any]:
        torch.manual_seed(0)
        model = Regression(dropout=0.2, optimizer="adam")
        saves = any(isinstance(callback, ModelCheckpoint) for callback in callbacks)
        trainer = quiet_trainer(max_epochs=3, callbacks=callbacks, enable_checkpointing=saves)
        trainer.fit(model, loader(regression_data(48), shuffle=True), ckpt_path=ckpt_path)
        return model, trainer

    reference, _ = fit([])
    on_exception = OnExceptionCheckpoint(tmp_path)
    checkpoint = ModelCheckpoint(
        dirpath=tmp_path / "mc", save_on_exception=True, save_last=True, filename="{step}"
    )
    with pytest.raises(KeyboardInterrupt):
        fit([FailAt(1, 2), on_exception, checkpoint])
    # Epoch 0 (6 steps) saved at its end; the interruption after 2 more batches saved step 8.
    assert sorted(os.listdir(tmp_path / "mc")) == ["last.ckpt", "step=6.ckpt", "step=8.ckpt"]
    assert torch.load(on_exception.ckpt_path, weights_only=True)["global_step"] == 8
    assert checkpoint.best_model_path == str(tmp_path / "mc" / "step=6.ckpt")  # not ranked: no fresh score

    for path in (on_exception.ckpt_path, str(tmp_path / "mc" / "step=8.ckpt")):
        resumed, trainer = fit([OnExceptionCheckpoint(tmp_path / "again")], ckpt_path=path)
        assert_same_weights(weights(resumed), weights(reference))
        assert trainer.global_step == 18
    # A fit that ends normally removes the (now outdated) exception checkpoint.
    fit([OnExceptionCheckpoint(tmp_path)], ckpt_path=on_exception.ckpt_path)
    assert not os.path.exists(on_exception.ckpt_path)


def test_early_stopping_resumes_from_the_last_checkpoint_of_an_epoch_end_validation(tmp_path: Path) -> None:
    # Two validations per epoch: EarlyStopping checks each when it ends, as Lightning does. It used
    # to defer the epoch's last one to on_train_epoch_end, so last.ckpt (written after that
    # validation) recorded a pending check, and the resumed run failed on a metric it never logged.
    def run(max_epochs: int, **fit: Any) -> tuple[EarlyStopping, Any]:
        stopping = EarlyStopping(monitor="score", patience=5)
        checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
        trainer = quiet_trainer(
            callbacks=[stopping, checkpoint],
            enable_checkpointing=True,
            max_epochs=max_epochs,
            val_check_interval=0.5,
        )
        trainer.fit(Scripted([4.0, 3.0, 2.0, 1.0]), loader(), loader(batch_size=64), **fit)
        return stopping, trainer

    stopping, trainer = run(1)
    assert stopping.best_score == 3.0 and trainer.fit_progress.validations_run == 2
    stopping, trainer = run(2, ckpt_path="last")
    assert trainer.fit_progress.validations_run == 4 and trainer.current_epoch == 2
    assert stopping.best_score == 1.0 and stopping.wait_count == 0


def test_early_stopping_resumes_with_the_patience_already_spent(tmp_path: Path) -> None:
    """Checks without improvement before the checkpoint count towards the patience after the resume."""
    scores = [1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]

    def run(max_epochs: int, **fit: Any) -> tuple[EarlyStopping, Any]:
        stopping = EarlyStopping(monitor="score", patience=3)
        checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
        trainer = quiet_trainer(
            callbacks=[stopping, checkpoint], enable_checkpointing=True, max_epochs=max_epochs
        )
        trainer.fit(Scripted(scores), loader(), loader(batch_size=64), **fit)
        return stopping, trainer

    stopping, trainer = run(3)  # epochs 1 and 2 do not beat epoch 0's 1.0
    assert stopping.wait_count == 2 and not trainer.should_stop
    stopping, trainer = run(len(scores), ckpt_path="last")
    # The third check without improvement (epoch 3) stops the run, as it would have without the resume.
    assert trainer.current_epoch == 4 and stopping.stopped_epoch == 3
    assert stopping.wait_count == 3 and stopping.best_score.item() == 1.0


def test_scores_are_tensors_as_in_lightning_also_after_a_resume(tmp_path: Path) -> None:
    # Ported Lightning scripts read `checkpoint_callback.best_model_score.item()` and
    # `early_stopping.best_score.item()`: the scores are 0-d tensors there, and were floats here.
    def run(max_epochs: int, **fit: Any) -> tuple[ModelCheckpoint, EarlyStopping]:
        checkpoint = ModelCheckpoint(dirpath=tmp_path, monitor="score", save_top_k=2, save_last=True)
        stopping = EarlyStopping(monitor="score", patience=5)
        trainer = quiet_trainer(
            callbacks=[checkpoint, stopping], enable_checkpointing=True, max_epochs=max_epochs
        )
        trainer.fit(Scripted([3.0, 1.5, 2.0]), loader(), loader(batch_size=64), **fit)
        return checkpoint, stopping

    for (checkpoint, stopping), kept in ((run(2), [1.5, 3.0]), (run(3, ckpt_path="last"), [1.5, 2.0])):
        scores = [checkpoint.best_model_score, *checkpoint.best_k_models.values(), stopping.best_score]
        assert all(isinstance(score, torch.Tensor) and score.dim() == 0 for score in scores)
        assert checkpoint.best_model_score.item() == 1.5  # type: ignore[union-attr]
        assert stopping.best_score.item() == 1.5
        assert sorted(score.item() for score in checkpoint.best_k_models.values()) == kept
        assert f"{checkpoint.best_model_score:.2f}" == "1.50"


def test_save_last_link_points_last_at_the_latest_checkpoint_and_resumes(tmp_path: Path) -> None:
    # Lightning's save_last="link": last.ckpt is a (relative) link to the newest checkpoint saved, replaced in one
    # rename; a validation that does not enter the top k leaves it on the previous one.
    checkpoint = ModelCheckpoint(
        dirpath=tmp_path, filename="{step}", monitor="score", save_top_k=2, save_last="link"
    )
    model = _fit(tmp_path, checkpoint, [3.0, 1.0, 2.0, 4.0], max_epochs=2)
    last = tmp_path / "last.ckpt"
    assert last.is_symlink() and os.readlink(last) == "step=12.ckpt"  # score 2.0, the newest in the top 2
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt", "step=12.ckpt", "step=8.ckpt"]  # no temporary left
    assert checkpoint.last_model_path == str(last) and checkpoint.current_score.item() == 2.0  # type: ignore[union-attr]
    assert_same_weights(_saved_weights(last), model.weights_at[2.0])
    resumed = quiet_trainer(
        callbacks=[ModelCheckpoint(dirpath=tmp_path, save_last="link")],
        enable_checkpointing=True,
        max_epochs=3,
    )
    resumed.fit(Scripted([5.0] * 6), loader(), loader(batch_size=64), ckpt_path="last")
    assert resumed.ckpt_path == str(last) and resumed.global_step == 24


def test_current_score_and_to_yaml(tmp_path: Path) -> None:
    import yaml

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "c", filename="{step}", monitor="score", save_top_k=2)
    assert checkpoint.current_score is None
    _fit(tmp_path, checkpoint, [3.0, 1.0, 2.0], max_epochs=3, val_check_interval=1.0)
    assert checkpoint.current_score.item() == 2.0  # type: ignore[union-attr]  # the last one that entered the top k
    checkpoint.to_yaml()
    saved = yaml.safe_load((tmp_path / "c" / "best_k_models.yaml").read_text())
    assert saved == {str(tmp_path / "c" / "step=16.ckpt"): 1.0, str(tmp_path / "c" / "step=24.ckpt"): 2.0}
    checkpoint.to_yaml(tmp_path / "other.yaml")
    assert yaml.safe_load((tmp_path / "other.yaml").read_text()) == saved
