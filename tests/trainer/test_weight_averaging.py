"""WeightAveraging and EMAWeightAveraging: the average follows its formula, validates, checkpoints and resumes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import drivetrain as dt
from drivetrain.trainer.callbacks import Callback, EMAWeightAveraging, ModelCheckpoint, WeightAveraging
from trainer.callback_models import Backboned, Snapshots, assert_close, mean, params
from trainer.trainer_models import loader, quiet_trainer, regression_data


def _fit(callbacks: list[Any], val: Any = None, **kwargs: Any) -> tuple[Backboned, dt.Trainer]:
    torch.manual_seed(0)
    model = Backboned()
    trainer = quiet_trainer(callbacks=callbacks, **kwargs)
    trainer.fit(model, loader(regression_data(32), batch_size=8), val)
    return model, trainer


def test_weight_averaging_ends_with_the_mean_of_the_weights_after_every_optimizer_step() -> None:
    snapshots = Snapshots()
    model, trainer = _fit([WeightAveraging(), snapshots], max_epochs=3, accumulate_grad_batches=2)
    assert (
        trainer.global_step == len(snapshots.after_step) == 6
    )  # one update per optimizer step, not per batch
    assert_close(params(model), mean(snapshots.after_step))


def test_ema_follows_its_formula_from_the_step_it_starts_at() -> None:
    decay = 0.8
    snapshots = Snapshots()
    ema = EMAWeightAveraging(decay=decay, update_starting_at_step=2, update_every_n_steps=2)
    model, _ = _fit([ema, snapshots], max_epochs=2)
    # Step indices 2, 4, 6 (0-based) update: the first copies, the others blend in (1 - decay) of the weights.
    updates = [snapshots.after_step[i] for i in (2, 4, 6)]
    expected = dict(updates[0])
    for weights in updates[1:]:
        expected = {k: decay * expected[k] + (1 - decay) * weights[k] for k in expected}
    assert_close(params(model), expected)


def test_ema_at_epoch_ends_only() -> None:
    snapshots = Snapshots()
    ema = EMAWeightAveraging(decay=0.5, update_every_n_steps=0, update_starting_at_epoch=1)
    model, _ = _fit([ema, snapshots], max_epochs=3)
    first, second = snapshots.epoch_end[1], snapshots.epoch_end[2]
    assert_close(params(model), {k: 0.5 * first[k] + 0.5 * second[k] for k in first})


def test_validation_runs_on_the_average_and_training_goes_on_from_the_trained_weights(tmp_path: Path) -> None:
    snapshots = Snapshots()
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=0)
    model, _trainer = _fit(
        [WeightAveraging(), snapshots, checkpoint],
        max_epochs=2,
        enable_checkpointing=True,
        val=loader(regression_data(8, seed=1), batch_size=8),
    )
    # Validation after epoch e saw the mean of the weights after every step so far (4 steps per epoch).
    for epoch, seen in enumerate(snapshots.validated):
        assert_close(seen, mean(snapshots.after_step[: 4 * (epoch + 1)]))
    # Training went on from the trained weights: the same steps as a fit without validation.
    unvalidated = Snapshots()
    _fit([WeightAveraging(), unvalidated], max_epochs=2)
    for ours, theirs in zip(snapshots.after_step, unvalidated.after_step, strict=True):
        assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert_close(dict(saved["state_dict"]), params(model))  # the average
    assert_close(dict(saved["current_model_state"]), snapshots.after_step[-1])
    assert int(saved["averaging_state"]["n_averaged"]) == 8
    # Evaluating the checkpoint uses the averaged weights it holds.
    fresh = Backboned()
    quiet_trainer().validate(
        fresh,
        loader(regression_data(8, seed=1), batch_size=8),
        ckpt_path=tmp_path / "last.ckpt",
        verbose=False,
    )
    assert_close(params(fresh), params(model))


class SaveAtStep(Callback):
    """A user's own checkpointing (not a ModelCheckpoint, which always runs last): listed before the averaging."""

    def __init__(self, path: Path, step: int) -> None:
        self.path, self.step = path, step

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


@pytest.mark.parametrize("own_saver", [False, True])
@pytest.mark.parametrize("make", [WeightAveraging, lambda: EMAWeightAveraging(decay=0.7)])
def test_a_resumed_fit_ends_with_the_same_average(tmp_path: Path, make: Any, own_saver: bool) -> None:
    """Also from a checkpoint saved by a callback that runs before the averaging one (its update is saved)."""

    def run(name: str, ckpt_path: Path | None) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = Backboned()
        checkpoint = ModelCheckpoint(
            dirpath=tmp_path / name, every_n_train_steps=3, save_top_k=-1, filename="{step}"
        )
        callbacks = [SaveAtStep(tmp_path / name / "own.ckpt", 6), make(), checkpoint]
        trainer = quiet_trainer(max_epochs=3, callbacks=callbacks, enable_checkpointing=True)
        trainer.fit(model, loader(regression_data(32), batch_size=8, shuffle=True), ckpt_path=ckpt_path)
        return params(model)

    full = run("full", None)
    resumed = run("resumed", tmp_path / "full" / ("own.ckpt" if own_saver else "step=6.ckpt"))  # mid-epoch 1
    assert all(torch.equal(full[k], resumed[k]) for k in full)


def test_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match="unknown argument"):
        WeightAveraging(decay=0.9)
    with pytest.raises(TypeError, match="avg_fn"):
        WeightAveraging(avg_fn=3)
    with pytest.raises(ValueError, match=r"decay=1.5"):
        EMAWeightAveraging(decay=1.5)
    with pytest.raises(ValueError, match="update_every_n_steps"):
        EMAWeightAveraging(update_every_n_steps=-1)
    with pytest.raises(TypeError, match="device"):
        WeightAveraging(device=1.5)


def test_the_modules_on_train_end_sees_the_averaged_weights() -> None:
    """Callbacks' on_train_end runs before the module's (Lightning 2.6), so the average is in place by then."""

    class Ending(Backboned):
        def on_train_end(self) -> None:
            self.at_train_end = params(self)

    torch.manual_seed(0)
    model, snapshots = Ending(), Snapshots()
    quiet_trainer(max_epochs=2, callbacks=[WeightAveraging(), snapshots]).fit(
        model, loader(regression_data(32), batch_size=8)
    )
    assert_close(model.at_train_end, mean(snapshots.after_step))
    assert not all(
        torch.equal(a, b) for a, b in zip(model.at_train_end.values(), snapshots.after_step[-1].values())
    )
