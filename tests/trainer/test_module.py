"""TrainingModule and DataModule: hyperparameters, the trainer reference, predict, pickling."""

from __future__ import annotations

import copy
import pickle
from argparse import Namespace
from typing import Any

import pytest
import torch

import drivetrain as dt
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data


def test_save_hyperparameters_forms() -> None:
    class Named(dt.TrainingModule):
        def __init__(self, width: int, depth: int = 2, *, act: str = "relu", **extra: Any) -> None:
            super().__init__()
            self.save_hyperparameters(ignore="depth")

    assert dict(Named(8, act="gelu", note="x").hparams) == {"width": 8, "act": "gelu", "note": "x"}

    class Chosen(dt.TrainingModule):
        def __init__(self, width: int, depth: int = 2) -> None:
            super().__init__()
            self.save_hyperparameters("depth")

    assert Chosen(8).hparams.depth == 2 and "width" not in Chosen(8).hparams

    class FromNamespace(dt.TrainingModule):
        def __init__(self, config: Namespace) -> None:
            super().__init__()
            self.save_hyperparameters(config)

    assert FromNamespace(Namespace(lr=0.1)).hparams.lr == 0.1

    class Wrong(dt.TrainingModule):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.save_hyperparameters("height")

    with pytest.raises(ValueError, match=r"'height' is not an argument of __init__ \(its arguments: width\)"):
        Wrong(1)


def test_trainer_reference_and_device() -> None:
    model = Regression()
    with pytest.raises(RuntimeError, match=r"Regression is not attached to a Trainer"):
        _ = model.trainer
    assert model.device == torch.device("cpu") and model.global_step == 0
    trainer = quiet_trainer(max_steps=2)
    trainer.fit(model, loader())
    assert model.trainer is trainer and model.global_step == 2


def test_trainer_can_be_assigned_as_in_lightning() -> None:
    # Lightning's tests and helpers attach a Trainer by hand (`model.trainer = trainer`) and detach it with None.
    outer = Regression()
    outer.inner = Regression()  # a module nested in another follows it, as in Lightning
    trainer = quiet_trainer(max_steps=1)
    outer.trainer = trainer
    assert outer.trainer is trainer and outer.inner.trainer is trainer
    assert outer.global_step == 0 and outer.current_epoch == 0 and outer.logger is trainer.logger
    outer.trainer = None
    with pytest.raises(RuntimeError, match=r"Regression is not attached to a Trainer"):
        _ = outer.inner.trainer
    with pytest.raises(TypeError, match=r"Regression.trainer = str: assign a drivetrain.Trainer, or None"):
        outer.trainer = "trainer"  # type: ignore[assignment]


def test_dtype_follows_the_weights_as_lightnings_does() -> None:
    model = Regression()
    assert model.dtype == torch.float32
    assert model.double().dtype == torch.float64 and model.half().dtype == torch.float16
    model.float()
    seen: list[torch.dtype] = []

    class Seen(Regression):
        def on_train_start(self) -> None:
            seen.append(self.dtype)

    quiet_trainer(max_steps=1, precision="bf16-true").fit(Seen(), loader())
    assert seen == [torch.bfloat16]
    with pytest.raises(RuntimeError, match=r"dtype follows the weights and cannot be set; convert them with"):
        model.dtype = torch.float64  # type: ignore[misc]


def test_predict_returns_every_batch_in_order() -> None:
    model = Regression()
    data = regression_data(20)
    predictions = quiet_trainer().predict(model, loader(data, batch_size=8))
    assert [p.shape[0] for p in predictions] == [8, 8, 4]
    assert torch.allclose(torch.cat(predictions), model(data.tensors[0]))
    assert quiet_trainer().predict(model, loader(data), return_predictions=False) is None


def test_modules_copy_and_pickle_without_their_trainer() -> None:
    model = Regression()
    quiet_trainer(max_steps=1).fit(model, loader())
    clone = copy.deepcopy(model)
    assert clone._trainer is None and model._trainer is not None
    assert pickle.loads(pickle.dumps(model))._trainer is None


def test_load_from_checkpoint_needs_a_trainer_checkpoint(tmp_path: Any) -> None:
    torch.save({"weights": {}}, tmp_path / "other.ckpt")
    with pytest.raises(
        ValueError, match=r"has no 'state_dict' entry \(it has 'weights'\); it was not written"
    ):
        Regression.load_from_checkpoint(tmp_path / "other.ckpt")


def test_load_from_checkpoint_of_a_folder_names_its_checkpoint_files(tmp_path: Any) -> None:
    # A plain folder was reported as "a sharded checkpoint (a directory)", pointing the user at consolidation.
    trainer = quiet_trainer(max_steps=1, default_root_dir=tmp_path, enable_checkpointing=True, logger="csv")
    trainer.fit(Regression(), loader())
    folder = tmp_path / "drivetrain_logs" / "version_0" / "checkpoints"
    with pytest.raises(
        ValueError,
        match=r"is a folder, not a checkpoint: .* It holds epoch=0-step=1\.ckpt: pass one of them\.",
    ):
        Regression.load_from_checkpoint(folder)
    with pytest.raises(
        ValueError, match=r"is a folder, not a checkpoint: load_from_checkpoint reads a checkpoint file"
    ):
        Regression.load_from_checkpoint(tmp_path)
    with pytest.raises(
        FileNotFoundError, match=r"ckpt_path='lastest' does not exist .*Did you mean ckpt_path='last'\?"
    ):
        quiet_trainer(max_steps=1).fit(Regression(), loader(), ckpt_path="lastest")


def test_rank_zero_only_is_public_as_lightnings(monkeypatch: pytest.MonkeyPatch) -> None:
    from drivetrain.trainer import rank_zero_only

    calls: list[int] = []

    @rank_zero_only
    def report(value: int) -> int:
        calls.append(value)
        return value

    assert report(1) == 1 and rank_zero_only.rank == 0
    monkeypatch.setenv("RANK", "1")  # what a launcher announces to its second process
    assert rank_zero_only.rank == 1 and report(2) is None
    assert rank_zero_only(lambda: "ran", default="skipped")() == "skipped"
    monkeypatch.delenv("RANK")
    rank_zero_only.rank = 3  # Lightning's tests act as another rank this way
    try:
        assert report(3) is None
    finally:
        rank_zero_only.rank = None  # back to the launcher's
    assert report(4) == 4 and calls == [1, 4]
