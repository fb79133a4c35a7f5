"""The tuner: ``Tuner.lr_find`` / ``LearningRateFinder`` and ``Tuner.scale_batch_size`` / ``BatchSizeFinder``."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt
from drivetrain.trainer.callbacks import BatchSizeFinder, Callback, LearningRateFinder
from drivetrain.trainer.tuner import LRFinder
from drivetrain.utils.memory import find_executable_batch_size, search_batch_size
from trainer.trainer_models import Regression, loader, quiet_trainer


@pytest.fixture(autouse=True)
def _in_a_fresh_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The finder saves its plot in default_root_dir (the working folder unless given): keep it out of the repo."""
    monkeypatch.chdir(tmp_path)


def _weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in module.state_dict().items()}


def _assert_same_tensors(left: Any, right: Any) -> None:
    if isinstance(left, torch.Tensor):
        assert isinstance(right, torch.Tensor) and torch.equal(left, right)
    elif isinstance(left, dict):
        assert isinstance(right, dict) and left.keys() == right.keys()
        for key in left:
            _assert_same_tensors(left[key], right[key])
    elif isinstance(left, (list, tuple)):
        assert len(left) == len(right)
        for a, b in zip(left, right):
            _assert_same_tensors(a, b)
    else:
        assert left == right


def _twin(model: Regression) -> Regression:
    twin = Regression(**model.hparams)
    twin.load_state_dict(model.state_dict())
    return twin


# -- learning-rate finder ---------------------------------------------------------------------------


def test_lr_find_suggests_a_rate_restores_the_weights_and_the_next_fit_trains_with_it(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Regression(optimizer="adam", lr=1e-3)
    twin = _twin(model)
    before = _weights(model)
    trainer = quiet_trainer(max_epochs=2, default_root_dir=tmp_path)
    finder = dt.Tuner(trainer).lr_find(model, loader(), min_lr=1e-5, max_lr=1.0, num_training=40)

    assert isinstance(finder, LRFinder)
    lrs, losses = finder.results["lr"], finder.results["loss"]
    assert 2 < len(lrs) == len(losses) <= 40
    assert lrs == sorted(lrs) and lrs[0] == pytest.approx(1e-5)
    suggestion = finder.suggestion()
    assert suggestion is not None and 1e-5 <= suggestion <= 1.0
    assert model.hparams.lr == suggestion  # update_attr: the hparams entry configure_optimizers reads
    _assert_same_tensors(_weights(model), before)
    assert trainer.callbacks == [] and trainer.loggers == []  # the Trainer's own, as built (quiet)
    assert finder.plot_path == str(tmp_path / "lr_find.png")
    assert (tmp_path / "lr_find.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The tuned fit is the fit of an untouched twin given the suggested rate: nothing else changed.
    trainer.fit(model, loader())
    twin.hparams.lr = suggestion
    quiet_trainer(max_epochs=2).fit(twin, loader())
    _assert_same_tensors(_weights(model), _weights(twin))


class RandomData(Regression):
    """Lightning's BoringModel habit: train_dataloader() draws its data from the global generator, and both an
    ``lr`` attribute and an ``hparams.lr`` entry exist."""

    def __init__(self) -> None:
        super().__init__(lr=0.1)
        self.lr = 0.1

    def train_dataloader(self) -> DataLoader:
        x = torch.randn(64, 4)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def test_repeated_lr_find_gives_the_same_results_and_updates_attribute_and_hparams() -> None:
    """As in Lightning: the search leaves the random generators as it found them (the data drawn by
    train_dataloader() is the same on every call), and update_attr sets ``lr`` and ``hparams.lr`` alike."""
    torch.manual_seed(1)
    model = RandomData()
    tuner = dt.Tuner(quiet_trainer(max_epochs=2, limit_train_batches=10))
    state = torch.get_rng_state()
    results = [tuner.lr_find(model, num_training=20).results for _ in range(3)]
    assert torch.equal(torch.get_rng_state(), state)
    assert len(results[0]["lr"]) == 20 and results[1] == results[0] and results[2] == results[0]
    suggestion = LRFinder("exponential", 1e-8, 1.0, 20)
    suggestion.results = results[0]
    assert model.lr == model.hparams.lr == suggestion.suggestion()


def test_lr_find_stops_early_when_the_loss_diverges() -> None:
    finder = dt.Tuner(quiet_trainer()).lr_find(
        Regression(), loader(), min_lr=1e-3, max_lr=1e4, num_training=80, update_attr=False
    )
    assert finder is not None
    assert len(finder.results["loss"]) < 80  # SGD at rates far above 1 blows the loss up
    assert finder.results["lr"][-1] < 1e4


def test_linear_mode_spaces_the_rates_evenly() -> None:
    # Ten steps are too few for a suggestion (the first ten are skipped): the finder says so.
    with pytest.warns(UserWarning, match="too few to suggest"):
        finder = dt.Tuner(quiet_trainer()).lr_find(
            Regression(),
            loader(),
            min_lr=0.01,
            max_lr=0.1,
            num_training=10,
            mode="linear",
            early_stop_threshold=None,
            update_attr=False,
        )
    assert finder is not None
    # Lightning's schedule: min_lr, then (step + 1) / num_training of the way, reaching max_lr at the last step.
    assert finder.results["lr"] == pytest.approx([0.01] + [0.01 + 0.009 * (k + 1) for k in range(1, 10)])


class _Watch(Callback):
    """What the fit looks like when training starts, after the finders ran in on_fit_start."""

    def __init__(self, finder: Any) -> None:
        self.finder = finder
        self.seen: dict[str, Any] = {}

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.seen = {
            "global_step": trainer.global_step,
            "lr": trainer.optimizers[0].param_groups[0]["lr"],
            "found": getattr(self.finder, "optimal_lr", None)
            or getattr(self.finder, "optimal_batch_size", None),
            "batches": trainer.num_training_batches,
        }


def test_learning_rate_finder_runs_at_fit_start_and_leaves_the_fit_as_it_would_have_been() -> None:
    torch.manual_seed(1)
    model = Regression(optimizer="adam", lr=0.01, dropout=0.2)  # dropout: the generators must be restored too
    twin = _twin(model)
    finder = LearningRateFinder(num_training_steps=30, update_attr=False)
    watch = _Watch(finder)
    torch.manual_seed(2)
    quiet_trainer(max_epochs=2, callbacks=[finder, watch]).fit(model, loader(shuffle=True))
    torch.manual_seed(2)
    quiet_trainer(max_epochs=2).fit(twin, loader(shuffle=True))

    assert watch.seen["global_step"] == 0 and watch.seen["found"] is finder.optimal_lr
    assert finder.optimal_lr is not None and finder.optimal_lr.suggestion() is not None
    assert watch.seen["lr"] == 0.01  # update_attr=False: the fit keeps its rate
    _assert_same_tensors(_weights(model), _weights(twin))


def test_learning_rate_finder_trains_the_fit_with_the_suggestion() -> None:
    finder = LearningRateFinder(num_training_steps=30)
    watch = _Watch(finder)
    model = Regression(lr=0.01)
    # Four epochs of 8 batches leave room for the 30 steps: the fit's max_epochs ends the test too, as in Lightning.
    quiet_trainer(max_epochs=4, callbacks=[finder, watch]).fit(model, loader())
    suggestion = finder.optimal_lr.suggestion() if finder.optimal_lr else None
    assert suggestion is not None
    assert watch.seen["lr"] == suggestion == model.hparams.lr


class _MidFitFinder(LearningRateFinder):
    """Lightning's recipe for a range test later in training: call lr_find from another hook."""

    def __init__(self) -> None:
        super().__init__(num_training_steps=20, update_attr=False)
        self.before: Any = None
        self.after: Any = None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        pass

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.current_epoch == 1:
            state = (
                _weights(pl_module),
                copy.deepcopy(trainer.optimizers[0].state_dict()),
                trainer.global_step,
            )
            self.before = state
            self.lr_find(trainer, pl_module)
            self.after = (
                _weights(pl_module),
                copy.deepcopy(trainer.optimizers[0].state_dict()),
                trainer.global_step,
            )


def test_lr_find_in_the_middle_of_a_fit_restores_weights_and_optimizer_state_exactly() -> None:
    finder = _MidFitFinder()
    trainer = quiet_trainer(max_epochs=2, callbacks=[finder])
    trainer.fit(Regression(optimizer="adam"), loader())
    assert finder.before is not None and finder.before[1]["state"], "Adam has state after an epoch"
    _assert_same_tensors(finder.after, finder.before)
    assert trainer.global_step == 16  # 2 epochs of 8 batches: the test's steps are not counted


def test_plot_needs_matplotlib_and_says_which_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    finder = LRFinder("exponential", 1e-4, 1.0, 20)
    finder.results = {"lr": [finder.lr_at(i) for i in range(20)], "loss": [1.0 / (i + 1) for i in range(20)]}
    figure = finder.plot(suggest=True, path=str(tmp_path / "plot.png"))
    assert figure.axes[0].get_xscale() == "log"
    assert (tmp_path / "plot.png").stat().st_size > 0

    from drivetrain._utilities import imports

    monkeypatch.setattr(imports, "package_available", lambda name: False)
    with pytest.raises(ImportError, match=r"pip install 'drivetrain\[plot\]'"):
        finder.plot()
    tuned = dt.Tuner(quiet_trainer(default_root_dir=tmp_path / "run")).lr_find(
        Regression(), loader(), num_training=20, update_attr=False
    )
    assert tuned is not None and tuned.plot_path is None and not (tmp_path / "run" / "lr_find.png").exists()


def test_suggestion_with_too_few_points_warns_and_returns_none() -> None:
    finder = LRFinder("linear", 0.1, 1.0, 5)
    finder.results = {"lr": [0.1, 0.2, 0.3], "loss": [1.0, 0.5, float("nan")]}
    with pytest.warns(UserWarning, match="too few to suggest"):
        assert finder.suggestion() is None


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"mode": "cosine"}, ValueError, "mode='cosine'"),
        ({"min_lr": 1.0, "max_lr": 0.1}, ValueError, "must be below"),
        ({"num_training": 1}, ValueError, "num_training=1"),
        ({"early_stop_threshold": -1}, ValueError, "early_stop_threshold"),
        ({"method": "test"}, ValueError, "'fit' only"),
        ({"attr_name": "step_size"}, AttributeError, "attr_name='step_size'"),
    ],
)
def test_lr_find_rejects_bad_settings(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        dt.Tuner(quiet_trainer()).lr_find(Regression(), loader(), **kwargs)


def test_lr_find_without_an_lr_attribute_says_how_to_fix_it() -> None:
    class NoRate(Regression):
        def __init__(self) -> None:
            super().__init__()
            self.hparams.pop("lr")

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    with pytest.raises(AttributeError, match="no 'lr' or 'learning_rate'"):
        dt.Tuner(quiet_trainer()).lr_find(NoRate(), loader())
    with pytest.raises(TypeError, match=r"expects a drivetrain\.Trainer"):
        dt.Tuner(object())  # type: ignore[arg-type]


# -- batch-size scaling -------------------------------------------------------------------------------

FEATURES, HIDDEN, SAMPLES = 64, 1024, 512


class Wide(dt.TrainingModule):
    """A module whose memory grows with the batch: a wide hidden layer per sample."""

    def __init__(self, batch_size: int = 2, fail_above: int | None = None) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.fail_above = fail_above
        self.net = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))
        self.batch_sizes_seen: set[int] = set()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.batch_sizes_seen.add(len(x))
        if self.fail_above is not None and len(x) > self.fail_above:
            # What a GPU raises when the batch does not fit (this machine has none to exhaust).
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {len(x) * HIDDEN * 4} bytes")
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        data = TensorDataset(
            torch.randn(SAMPLES, FEATURES, generator=generator), torch.randn(SAMPLES, 1, generator=generator)
        )
        return DataLoader(data, batch_size=self.batch_size)


def _calibrate() -> dict[int, int]:
    """Each power of two's footprint, from a search under a limit everything fits in."""
    finder = BatchSizeFinder(max_memory="1TB")
    quiet_trainer(max_epochs=1, callbacks=[finder]).fit(Wide())
    assert finder.optimal_batch_size == SAMPLES  # nothing stops it before the data set's size
    sizes = {trial.batch_size: trial.footprint.total for trial in finder.trials if trial.footprint}
    assert sorted(sizes) == [2**k for k in range(1, 10)]
    return sizes


def test_scale_batch_size_under_a_memory_limit_finds_the_power_of_two_and_the_binsearch_size() -> None:
    footprints = _calibrate()
    weights = sum(p.numel() * 4 for p in Wide().parameters())
    for size, total in footprints.items():
        # Measured, not guessed: at least the weights and Adam's two moments (from the second step on),
        # plus the batch and the hidden activations kept for the backward pass.
        assert total >= 3 * weights + size * (FEATURES + 1 + HIDDEN) * 4
    assert [footprints[2**k] for k in range(1, 10)] == sorted(footprints.values())
    limit = (footprints[64] + footprints[128]) // 2

    model = Wide()
    before = _weights(model)
    trainer = quiet_trainer()
    tuner = dt.Tuner(trainer)
    assert tuner.scale_batch_size(model, max_memory=limit) == 64
    assert model.batch_size == 64
    _assert_same_tensors(_weights(model), before)

    finder = BatchSizeFinder(mode="binsearch", max_memory=limit, margin=0)
    watch = _Watch(finder)
    model = Wide()
    quiet_trainer(max_epochs=1, callbacks=[finder, watch]).fit(model)
    found = finder.optimal_batch_size
    assert found is not None and 64 < found < 128
    outcome = {trial.batch_size: trial.fits for trial in finder.trials}
    assert outcome[found] is True and outcome[found + 1] is False
    # The same size measures the same in another run: the limit is a deterministic test.
    assert next(t.footprint.total for t in finder.trials if t.batch_size == 64) == footprints[64]
    # The fit trained with the size found: batches of `found` (and the remainder).
    assert watch.seen["found"] == found and watch.seen["batches"] == math.ceil(SAMPLES / found)
    assert model.batch_size == found and max(model.batch_sizes_seen) == 128  # the trial that did not fit


# binsearch finds 24, then keeps Lightning's default 5% margin below it.
@pytest.mark.parametrize(("mode", "expected"), [("power", 16), ("binsearch", 22)])
def test_a_device_out_of_memory_error_means_the_batch_does_not_fit(mode: str, expected: int) -> None:
    model = Wide(fail_above=24)
    assert dt.Tuner(quiet_trainer()).scale_batch_size(model, mode=mode, init_val=4) == expected
    assert model.batch_size == expected


def test_an_initial_size_that_does_not_fit_is_halved_as_find_executable_batch_size_does() -> None:
    model = Wide(fail_above=5)
    assert dt.Tuner(quiet_trainer()).scale_batch_size(model, init_val=64, mode="binsearch", margin=0) == 5


def test_the_search_is_shared_with_find_executable_batch_size() -> None:
    tried: list[int] = []

    def trial(size: int) -> None:
        tried.append(size)
        if size > 100:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    assert search_batch_size(trial, init_val=3, mode="power") == 96
    assert tried == [3, 6, 12, 24, 48, 96, 192]
    tried.clear()
    assert search_batch_size(trial, init_val=512, mode="binsearch") == 100
    assert tried[:4] == [512, 256, 128, 64]  # halved first, exactly as the decorator does
    assert search_batch_size(trial, init_val=2, max_trials=3) == 8  # 2, 4, 8: out of trials
    assert search_batch_size(trial, init_val=2, max_val=40) == 40

    @find_executable_batch_size(starting_batch_size=512, reduce_batch_size_fn=lambda size: size // 2)
    def train(batch_size: int) -> int:
        trial(batch_size)
        return batch_size

    assert train() == 64

    def never(size: int) -> None:
        raise torch.OutOfMemoryError("out of memory")

    with pytest.raises(RuntimeError, match="No executable batch size"):
        search_batch_size(never, init_val=4)


def test_scale_batch_size_rejects_what_it_cannot_honour() -> None:
    tuner = dt.Tuner(quiet_trainer())
    with pytest.raises(ValueError, match="passed to fit"):
        tuner.scale_batch_size(Regression(), loader())
    with pytest.raises(AttributeError, match="'micro_batch'"):
        tuner.scale_batch_size(Wide(), batch_arg_name="micro_batch")
    with pytest.raises(ValueError, match="max_memory='2XB' is not a size"):
        tuner.scale_batch_size(Wide(), max_memory="2XB")
    with pytest.raises(ValueError, match="mode='linear'"):
        BatchSizeFinder(mode="linear")
    with pytest.raises(ValueError, match="steps_per_trial=0"):
        BatchSizeFinder(steps_per_trial=0)
    with pytest.raises(ValueError, match=r"margin=1\.5"):
        BatchSizeFinder(margin=1.5)
    with pytest.raises(RuntimeError, match="not even a batch of 1 fits in max_memory=1024"):
        tuner.scale_batch_size(Wide(), max_memory=1024)


# -- two processes ------------------------------------------------------------------------------------


def _tune_in_two_processes(rank: int, world: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = Regression(optimizer="adam", lr=0.01)
    before = _weights(model)
    trainer = quiet_trainer(strategy="ddp", devices=2)
    finder = dt.Tuner(trainer).lr_find(model, loader(), num_training=30)
    assert finder is not None
    _assert_same_tensors(_weights(model), before)
    refused = ""
    try:
        dt.Tuner(trainer).scale_batch_size(Wide())
    except ValueError as error:
        refused = str(error)
    return {"results": finder.results, "lr": model.hparams.lr, "refused": refused}


@pytest.mark.multiprocess
@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="the ranks are forked, and where CUDA is present autograd's device threads (started by earlier tests' "
    "backward passes) make autograd unusable in a forked child",
)
def test_lr_find_under_ddp_agrees_on_every_process() -> None:
    from helpers.multiprocess import run_processes

    first, second = run_processes(_tune_in_two_processes, 2, timeout=90)
    # Each step's loss is the mean over the processes, so they stop together and suggest the same rate.
    assert first["results"] == second["results"] and len(first["results"]["loss"]) > 12
    assert first["lr"] == second["lr"] != 0.01
    assert "runs in one process; this Trainer runs 2" in first["refused"]


# -- a real GPU ------------------------------------------------------------------------------------------


class DeviceHungry(dt.TrainingModule):
    """Each sample needs 1/40 of the GPU's memory during the step: 32 fit, 64 run out of memory."""

    def __init__(self) -> None:
        super().__init__()
        self.batch_size = 2
        self.lr = 0.01
        self.net = nn.Linear(FEATURES, 1)
        self.per_sample = torch.cuda.get_device_properties(0).total_memory // 40 // 4  # float32 values

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        activations = torch.ones(len(x), self.per_sample, device=x.device)  # a real allocation on the device
        return nn.functional.mse_loss(self.net(x), y) + 0 * activations[:, :1].mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def train_dataloader(self) -> DataLoader:
        data = TensorDataset(torch.randn(SAMPLES, FEATURES), torch.randn(SAMPLES, 1))
        return DataLoader(data, batch_size=self.batch_size)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_running_out_of_memory_means_the_batch_does_not_fit() -> None:
    model = DeviceHungry()
    trainer = quiet_trainer(accelerator="gpu", devices=1, max_epochs=1)
    assert dt.Tuner(trainer).scale_batch_size(model) == 32  # 64 samples ask for 160% of the memory
    finder = BatchSizeFinder(mode="binsearch", init_val=32, margin=0)
    quiet_trainer(accelerator="gpu", devices=1, max_epochs=1, callbacks=[finder]).fit(model)
    found = finder.optimal_batch_size
    assert found is not None and 32 <= found < 40
    outcome = {trial.batch_size: trial.fits for trial in finder.trials}
    assert outcome[found] and outcome[found + 1] is False and outcome[64] is False
    with pytest.raises(ValueError, match="limits the memory of a CPU run"):
        dt.Tuner(trainer).scale_batch_size(DeviceHungry(), max_memory="1GB")
    # The range test on the GPU, under fp16 loss scaling: weights and the scaler come back as they were.
    lr_model = Regression(lr=0.01).cuda()
    before = _weights(lr_model)
    tuner = dt.Tuner(quiet_trainer(accelerator="gpu", devices=1, precision="16-mixed"))
    lr_finder = tuner.lr_find(lr_model, loader(), num_training=30)
    assert lr_finder is not None and lr_model.hparams.lr == lr_finder.suggestion()
    _assert_same_tensors(_weights(lr_model), before)


class WideData(dt.DataModule):
    """The loaders and their batch size in a DataModule, as Lightning programs often have them."""

    def __init__(self, batch_size: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        data = TensorDataset(
            torch.randn(SAMPLES, FEATURES, generator=generator), torch.randn(SAMPLES, 1, generator=generator)
        )
        return DataLoader(data, batch_size=self.hparams.batch_size)


def test_the_batch_size_can_live_in_a_datamodule_hparams_entry() -> None:
    class WideFromData(Wide):
        def train_dataloader(self) -> DataLoader:
            raise AssertionError("the DataModule provides the loaders")

    model = WideFromData(fail_above=24)
    del model.batch_size  # only the DataModule holds it
    data = WideData()
    assert (
        dt.Tuner(quiet_trainer()).scale_batch_size(model, datamodule=data, mode="binsearch", margin=0) == 24
    )
    assert data.hparams.batch_size == 24 and "batch_size" not in vars(model)
