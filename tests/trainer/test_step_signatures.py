"""Steps and batch hooks are called with the arguments they take, as Lightning calls them.

Lightning looks at ``training_step``/``validation_step``/``test_step``/``predict_step`` once and
passes ``batch_idx`` only to a step that takes it; the ``on_<stage>_batch_*`` hooks of the module
and the callbacks get ``dataloader_idx`` only when there are several loaders.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.trainer.callbacks import Callback
from trainer.trainer_models import loader, quiet_trainer, regression_data


class BatchOnly(dt.TrainingModule):
    """Every step takes the batch only; the batch hooks take no ``dataloader_idx``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.seen: list[str] = []

    def training_step(self, batch: Any) -> torch.Tensor:
        self.seen.append("training_step")
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any) -> None:
        self.seen.append("validation_step")

    def test_step(self, batch: Any) -> None:
        self.seen.append("test_step")

    def predict_step(self, batch: Any) -> torch.Tensor:
        self.seen.append("predict_step")
        return self.net(batch[0])

    def on_validation_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.seen.append(f"on_validation_batch_start:{batch_idx}")

    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.seen.append(f"on_validation_batch_end:{batch_idx}")

    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.seen.append(f"on_test_batch_end:{batch_idx}")

    def on_predict_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.seen.append(f"on_predict_batch_start:{batch_idx}")

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class NoLoaderIndex(Callback):
    """A Lightning-style callback whose evaluation batch hooks take no ``dataloader_idx``."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def on_validation_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.seen.append(("validation", batch_idx))

    def on_test_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.seen.append(("test", batch_idx))

    def on_predict_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.seen.append(("predict", batch_idx))


def test_steps_without_batch_idx_and_hooks_without_dataloader_idx() -> None:
    module, callback = BatchOnly(), NoLoaderIndex()
    data = loader(regression_data(16), batch_size=8)  # 2 batches
    trainer = quiet_trainer(max_epochs=1, callbacks=[callback])
    trainer.fit(module, data, data)
    trainer.test(module, data, verbose=False)
    predictions = trainer.predict(module, data)
    assert module.seen == [
        *["training_step"] * 2,
        "on_validation_batch_start:0", "validation_step", "on_validation_batch_end:0",
        "on_validation_batch_start:1", "validation_step", "on_validation_batch_end:1",
        "test_step", "on_test_batch_end:0", "test_step", "on_test_batch_end:1",
        "on_predict_batch_start:0", "predict_step", "on_predict_batch_start:1", "predict_step",
    ]  # fmt: skip
    assert callback.seen == [
        (stage, index) for stage in ("validation", "test", "predict") for index in (0, 1)
    ]
    assert len(predictions) == 2


class GAN(dt.TrainingModule):
    """Lightning's GAN example shape: manual optimisation, ``training_step(self, batch)``."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Linear(2, 4)
        self.discriminator = nn.Linear(4, 1)
        self.steps = 0

    def training_step(self, batch: Any) -> None:
        g_opt, d_opt = self.optimizers()
        x, _ = batch
        noise = torch.randn(len(x), 2)
        g_loss = -self.discriminator(self.generator(noise)).mean()
        g_opt.zero_grad()
        self.manual_backward(g_loss)
        g_opt.step()
        d_loss = self.discriminator(self.generator(noise).detach()).mean() - self.discriminator(x).mean()
        d_opt.zero_grad()
        self.manual_backward(d_loss)
        d_opt.step()
        self.steps += 1

    def configure_optimizers(self) -> Any:
        return [
            torch.optim.Adam(self.generator.parameters(), lr=1e-3),
            torch.optim.Adam(self.discriminator.parameters(), lr=1e-3),
        ]


def test_manual_optimisation_step_without_batch_idx() -> None:
    module = GAN()
    trainer = quiet_trainer(max_steps=6)
    trainer.fit(module, loader(regression_data(24), batch_size=8))
    assert module.steps == 3 and trainer.global_step == 6


def _logged(step: Any) -> Any:
    @functools.wraps(step)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return step(*args, **kwargs)

    return wrapper


class Decorated(BatchOnly):
    """A decorated step is judged by the function underneath (``__wrapped__``), as in Lightning."""

    @_logged
    def training_step(self, batch: Any) -> torch.Tensor:
        return super().training_step(batch)


def test_a_decorated_step_is_called_by_the_signature_underneath() -> None:
    module = Decorated()
    quiet_trainer(max_epochs=1, limit_val_batches=0).fit(module, loader(regression_data(16)))
    assert module.seen == ["training_step"] * 2


class SeveralLoaders(BatchOnly):
    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.seen.append(f"validation_step:{dataloader_idx}")

    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.seen.append(f"on_validation_batch_start:{dataloader_idx}")


class SeveralLoadersEveryHook(SeveralLoaders):
    def on_validation_batch_end(
        self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self.seen.append(f"on_validation_batch_end:{dataloader_idx}")


def test_several_loaders_pass_dataloader_idx_and_hooks_that_cannot_take_it_are_refused() -> None:
    data = loader(regression_data(8), batch_size=8)
    trainer = quiet_trainer()
    with pytest.raises(TypeError, match=r"on_validation_batch_end.*dataloader_idx=0"):
        trainer.validate(SeveralLoaders(), [data, data], verbose=False)
    module = SeveralLoadersEveryHook()
    trainer.validate(module, [data, data], verbose=False)
    assert module.seen == [
        "on_validation_batch_start:0", "validation_step:0", "on_validation_batch_end:0",
        "on_validation_batch_start:1", "validation_step:1", "on_validation_batch_end:1",
    ]  # fmt: skip


class NeedsIndex(BatchOnly):
    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int) -> None:
        pass


def test_one_loader_and_a_hook_requiring_dataloader_idx_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match=r"one test loader.*on_test_batch_end requires it.*dataloader_idx=0"):
        quiet_trainer().test(NeedsIndex(), loader(regression_data(8)), verbose=False)


class EpochEnds(Callback):
    def __init__(self) -> None:
        self.epochs = 0

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.epochs += 1


def test_a_hook_set_to_none_is_switched_off() -> None:
    """``module.validation_step = None`` (Lightning's documented way to skip validation) and a hook set to
    ``None`` on a callback or module instance are not called, as in Lightning."""
    from trainer.trainer_models import Regression

    module = Regression()
    module.validation_step = None  # type: ignore[method-assign, assignment]
    module.on_train_batch_end = None  # type: ignore[method-assign, assignment]
    switched_off, counting = EpochEnds(), EpochEnds()
    switched_off.on_train_epoch_end = None  # type: ignore[method-assign, assignment]
    data = loader(regression_data(16))
    with pytest.warns(UserWarning, match="has no validation_step; validation is skipped"):
        quiet_trainer(max_epochs=2, callbacks=[switched_off, counting]).fit(module, data, data)
    assert counting.epochs == 2 and switched_off.epochs == 0
