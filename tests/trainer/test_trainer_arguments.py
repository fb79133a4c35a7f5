"""Lightning's Trainer arguments ``min_steps`` and ``detect_anomaly``: each has the effect Lightning documents."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from drivetrain.trainer.callbacks import Callback
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data


class StopAtOnce(Callback):
    """Asks to stop after every batch (as early stopping would)."""

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        trainer.should_stop = True


def test_min_steps_holds_off_a_stop_request_until_reached() -> None:
    data = loader(regression_data(32), batch_size=8)  # 4 steps per epoch
    trainer = quiet_trainer(max_epochs=5, min_steps=6, callbacks=[StopAtOnce()])
    trainer.fit(Regression(), data)
    assert trainer.global_step == 6  # into the second epoch, then the stop is honoured at once
    trainer = quiet_trainer(max_epochs=5, callbacks=[StopAtOnce()])
    trainer.fit(Regression(), data)
    assert trainer.global_step == 1
    with pytest.raises(ValueError, match="min_steps=5 is more than max_steps=3"):
        quiet_trainer(max_steps=3, min_steps=5)
    with pytest.raises(ValueError, match="min_steps=-1"):
        quiet_trainer(min_steps=-1)


class NanGradient(Regression):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return (self(batch[0]) * 0).sqrt().sum()  # sqrt'(0) = inf, times 0: NaN in the backward pass


def test_detect_anomaly_names_the_operation_that_produced_nan() -> None:
    data = loader(regression_data(8), batch_size=8)
    with pytest.raises(RuntimeError, match=r"Function '\w+Backward0' returned nan values"):
        quiet_trainer(max_epochs=1, detect_anomaly=True).fit(NanGradient(), data)
    quiet_trainer(max_epochs=1).fit(NanGradient(), data)  # off by default: the NaN goes unnoticed
    assert not torch.is_anomaly_enabled()
    with pytest.raises(TypeError, match="detect_anomaly expects True or False"):
        quiet_trainer(detect_anomaly="yes")
