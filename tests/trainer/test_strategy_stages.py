"""Every strategy through every stage: fit with validation, validate, test, predict, fit again.

One program per strategy (:func:`run_stages`) runs the stages in Lightning's usual order on one
Trainer, saving a checkpoint after ``fit``, ``validate`` and ``test`` (all ranks call it) and
reading one back. Each stage's result is checked against the same module evaluated by hand on
the full weights: metric values, the number of samples seen, predictions (every sample once, in
dataset order), and that training changed the weights. Multi-process strategies run in one
two-process start per launch kind (several strategies share it) to keep the suite fast.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from drivetrain._utilities.imports import package_available
from helpers.multiprocess import run_processes
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data

DEEPSPEED = package_available("deepspeed")
TRAIN, VAL, TEST, PREDICT = (
    regression_data(32, seed=1),
    regression_data(16, seed=2),
    regression_data(24, seed=3),
    regression_data(24, seed=4),
)
UNEVEN, ONE_BATCH = regression_data(20, seed=5), regression_data(4, seed=6)


class StageModel(Regression):
    """The test regressor, with a sample count in validation too."""

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))
        self.log("val_count", float(len(x)), reduce_fx="sum")


def _expected(state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """What the stages must report for a module holding ``state``, computed by hand in one process."""
    reference = Regression()
    reference.load_state_dict({k: v.detach().to("cpu", torch.float32) for k, v in state.items()})
    with torch.no_grad():
        return {
            "val_loss": nn.functional.mse_loss(reference(VAL.tensors[0]), VAL.tensors[1]).item(),
            "test_loss": nn.functional.mse_loss(reference(TEST.tensors[0]), TEST.tensors[1]).item(),
            "predictions": reference(PREDICT.tensors[0]),
            "uneven_loss": nn.functional.mse_loss(reference(UNEVEN.tensors[0]), UNEVEN.tensors[1]).item(),
            "uneven_predictions": reference(UNEVEN.tensors[0]),
            "one_batch_loss": nn.functional.mse_loss(
                reference(ONE_BATCH.tensors[0]), ONE_BATCH.tensors[1]
            ).item(),
        }


def _full_state(trainer: Any, model: Any) -> dict[str, torch.Tensor]:
    """The module's full weights on global rank 0 (every rank must call; ``{}`` elsewhere on sharded strategies)."""
    state = trainer.strategy.get_module_state_dict(trainer.model if trainer.model is not None else model)
    return {k: v.detach().clone().cpu() for k, v in state.items()}


def run_stages(name: str, devices: int, root: str) -> dict[str, Any]:
    """fit (with validation) → save → validate → save → test → save → predict → validate a checkpoint → fit again."""
    torch.manual_seed(0)
    model = StageModel(lr=0.05)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    trainer = quiet_trainer(strategy=name, devices=devices, max_epochs=2, num_sanity_val_steps=2)
    val, test = loader(VAL, batch_size=4), loader(TEST, batch_size=4)
    trainer.fit(model, loader(TRAIN, batch_size=4), val)
    fit_val = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val_")}
    steps = trainer.global_step
    after_fit = _full_state(trainer, model)
    # The launching process of spawned ranks holds their weights only (their optimizers ended with them).
    weights_only = name == "ddp_spawn"
    trainer.save_checkpoint(Path(root) / f"{name}-fit.ckpt", weights_only=weights_only)
    validated = trainer.validate(model, val, verbose=False)[0]
    _save_after_evaluation(trainer, name, Path(root) / f"{name}-validate.ckpt", weights_only)
    tested = trainer.test(model, test, verbose=False)[0]
    _save_after_evaluation(trainer, name, Path(root) / f"{name}-test.ckpt", weights_only)
    predictions = trainer.predict(model, loader(PREDICT, batch_size=4))
    checkpoint = Path(root) / f"{name}-fit.ckpt"
    if name == "deepspeed_stage_3":
        # DeepSpeed restores ZeRO-3 weights through an optimizer only: evaluating a checkpoint is a clear
        # error (deepspeed_checkpoint.load_engine_state), which would end this job.
        from_checkpoint = validated
    else:
        from_checkpoint = trainer.validate(model, val, ckpt_path=checkpoint, verbose=False)[0]
    trainer.fit(model, loader(TRAIN, batch_size=4), val)
    after_refit = _full_state(trainer, model)
    refit_val = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val_")}
    # Shares that differ between processes: 5 batches (rank 0 gets one more than rank 1), and 1 batch (rank 1
    # gets none). Where the forward is a collective (FSDP, ZeRO-3) the process with fewer runs discarded forwards.
    uneven = loader(UNEVEN, batch_size=4)
    uneven_val = trainer.validate(model, uneven, verbose=False)[0]
    uneven_predictions = trainer.predict(model, uneven)
    one_batch_val = trainer.validate(model, loader(ONE_BATCH, batch_size=4), verbose=False)[0]
    return {
        "uneven_val": uneven_val,
        "uneven_predictions": torch.cat([p.detach().cpu() for p in uneven_predictions]),
        "one_batch_val": one_batch_val,
        "initial": initial,
        "after_fit": after_fit,
        "steps": steps,
        "fit_val": fit_val,
        "validated": validated,
        "tested": tested,
        "predictions": torch.cat([p.detach().cpu() for p in predictions]),
        "from_checkpoint": from_checkpoint,
        "refit_val": refit_val,
        "refit_steps": trainer.global_step,
        "after_refit": after_refit,
    }


def _save_after_evaluation(trainer: Any, name: str, path: Path, weights_only: bool) -> None:
    if name == "deepspeed_stage_3":  # DeepSpeed cannot write an evaluation engine at ZeRO-3: a clear error
        with pytest.raises(RuntimeError, match="ZeRO-3 engine built for evaluation"):
            trainer.save_checkpoint(path)
        return
    trainer.save_checkpoint(path, weights_only=weights_only)
    assert path.exists()


def check_stages(results: list[dict[str, Any]], world_size: int) -> None:
    """Every rank's stages report what the weights rank 0 gathered imply."""
    main = results[0]
    steps_per_epoch = len(TRAIN) // 4 // world_size
    assert main["steps"] == main["refit_steps"] == 2 * steps_per_epoch
    assert any(not torch.equal(main["initial"][k], main["after_fit"][k]) for k in main["initial"]), (
        "fit left the weights"
    )
    assert any(not torch.equal(main["after_fit"][k], main["after_refit"][k]) for k in main["after_fit"]), (
        "fit after test left the weights"
    )
    expected, refit = _expected(main["after_fit"]), _expected(main["after_refit"])
    for rank, result in enumerate(results):
        where = f"rank {rank}"
        # The last validation inside fit ran on the final weights.
        assert result["fit_val"]["val_loss"] == pytest.approx(expected["val_loss"], abs=1e-5), where
        assert result["fit_val"]["val_count"] == len(VAL), where
        assert result["validated"]["val_loss"] == pytest.approx(expected["val_loss"], abs=1e-5), where
        assert result["validated"]["val_count"] == len(VAL), where
        assert result["tested"]["test_loss"] == pytest.approx(expected["test_loss"], abs=1e-5), where
        assert result["tested"]["test_count"] == len(TEST), where
        assert result["from_checkpoint"]["val_loss"] == pytest.approx(expected["val_loss"], abs=1e-5), where
        torch.testing.assert_close(result["predictions"], expected["predictions"], atol=1e-5, rtol=0)
        assert result["refit_val"]["val_loss"] == pytest.approx(refit["val_loss"], abs=1e-5), where
        assert result["uneven_val"] == {
            "val_loss": pytest.approx(refit["uneven_loss"], abs=1e-5),
            "val_count": len(UNEVEN),
        }, where
        torch.testing.assert_close(
            result["uneven_predictions"], refit["uneven_predictions"], atol=1e-5, rtol=0
        )
        assert result["one_batch_val"] == {
            "val_loss": pytest.approx(refit["one_batch_loss"], abs=1e-5),
            "val_count": len(ONE_BATCH),
        }, where


def _quiet() -> None:
    # DeepSpeed 0.19.8 calls torch collectives that torch 2.13 deprecated and imports torch._inductor,
    # whose import uses the deprecated torch.jit.script_method; the ranks inherit warnings-as-errors.
    warnings.filterwarnings(
        "ignore", message=r".* is deprecated\. Please use .*_single", category=FutureWarning
    )
    warnings.filterwarnings(
        "ignore", message=r"`torch\.jit\.script_method` is deprecated", category=DeprecationWarning
    )


def _rank(rank: int, world_size: int, names: list[str], root: str) -> dict[str, Any]:
    _quiet()
    return {name: run_stages(name, world_size, root) for name in names}


def test_single_device_runs_every_stage(tmp_path: Path) -> None:
    check_stages([run_stages("single_device", 1, str(tmp_path))], 1)


@pytest.mark.multiprocess
def test_ddp_and_fsdp_run_every_stage_on_two_processes(tmp_path: Path) -> None:
    names = ["ddp", "fsdp"]
    results = run_processes(_rank, 2, args=(names, str(tmp_path)), timeout=110)
    for name in names:
        check_stages([result[name] for result in results], 2)


@pytest.mark.multiprocess
@pytest.mark.deepspeed
@pytest.mark.skipif(not DEEPSPEED, reason="needs the deepspeed extra")
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_runs_every_stage_on_two_processes(tmp_path: Path, stage: int) -> None:
    name = f"deepspeed_stage_{stage}"
    results = run_processes(_rank, 2, args=([name], str(tmp_path)), timeout=110)
    check_stages([result[name] for result in results], 2)


@pytest.mark.multiprocess
def test_ddp_spawn_fits_validates_and_saves_on_two_processes(tmp_path: Path) -> None:
    # Each entry point spawns its processes anew: the stages are split over two tests to stay quick.
    torch.manual_seed(0)
    model = StageModel(lr=0.05)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    trainer = quiet_trainer(strategy="ddp_spawn", devices=2, max_epochs=2, num_sanity_val_steps=2)
    val = loader(VAL, batch_size=4)
    trainer.fit(model, loader(TRAIN, batch_size=4), val)
    assert trainer.global_step == 2 * len(TRAIN) // 4 // 2
    trained = {k: v.detach().clone() for k, v in model.state_dict().items()}  # handed back by the ranks
    assert any(not torch.equal(initial[k], trained[k]) for k in initial)
    expected = _expected(trained)
    assert float(trainer.callback_metrics["val_loss"]) == pytest.approx(expected["val_loss"], abs=1e-5)
    # This process has the weights but not the ranks' optimizers: a full save is a clear error.
    with pytest.raises(RuntimeError, match="weights_only=True"):
        trainer.save_checkpoint(tmp_path / "full.ckpt")
    trainer.save_checkpoint(tmp_path / "weights.ckpt", weights_only=True)
    validated = trainer.validate(model, val, ckpt_path=tmp_path / "weights.ckpt", verbose=False)[0]
    assert validated == {"val_loss": pytest.approx(expected["val_loss"], abs=1e-5), "val_count": len(VAL)}


@pytest.mark.multiprocess
def test_ddp_spawn_tests_predicts_and_fits_again_on_two_processes() -> None:
    torch.manual_seed(0)
    model = StageModel(lr=0.05)
    expected = _expected(model.state_dict())
    trainer = quiet_trainer(strategy="ddp_spawn", devices=2, max_epochs=1)
    tested = trainer.test(model, loader(TEST, batch_size=4), verbose=False)[0]
    assert tested == {"test_loss": pytest.approx(expected["test_loss"], abs=1e-5), "test_count": len(TEST)}
    predictions = torch.cat(trainer.predict(model, loader(PREDICT, batch_size=4)))
    torch.testing.assert_close(predictions, expected["predictions"], atol=1e-5, rtol=0)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    trainer.fit(model, loader(TRAIN, batch_size=4), loader(VAL, batch_size=4))
    after = model.state_dict()
    assert trainer.global_step == len(TRAIN) // 4 // 2
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert float(trainer.callback_metrics["val_loss"]) == pytest.approx(
        _expected(after)["val_loss"], abs=1e-5
    )
