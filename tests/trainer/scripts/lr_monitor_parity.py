"""LearningRateMonitor in several configurations, on Lightning or on drivetrain (only the imports differ).

``python lr_monitor_parity.py lightning OUT.pt`` saves, per case, the callback's ``lrs``,
``last_momentum_values`` and ``last_weight_decay_values`` and the (step, name, value) of every rate
the logger received; the test runs the same cases on drivetrain and compares.
"""

from __future__ import annotations

import sys
import tempfile
import warnings
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def _framework(name: str) -> Any:
    if name == "lightning":
        import lightning.pytorch as framework
        from lightning.pytorch import callbacks, loggers
    else:
        import drivetrain as framework
        from drivetrain import loggers
        from drivetrain.trainer import callbacks
    return framework, callbacks, loggers


def _sgd_groups(module: Any) -> Any:
    groups = [{"params": module.first.parameters(), "lr": 0.2}, {"params": module.second.parameters()}]
    optimizer = torch.optim.SGD(groups, lr=0.1, momentum=0.9, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    return [optimizer], [{"scheduler": scheduler, "interval": "step"}]


def _two_adams_named(module: Any) -> Any:
    first = torch.optim.Adam(module.first.parameters(), lr=0.01, betas=(0.8, 0.99))
    second = torch.optim.Adam(module.second.parameters(), lr=0.02)
    third = torch.optim.SGD([{"params": module.parameters(), "name": "all"}], lr=0.3)
    named = {"scheduler": torch.optim.lr_scheduler.StepLR(second, step_size=1, gamma=0.5), "name": "my_rate"}
    return [first, second, third], [torch.optim.lr_scheduler.StepLR(first, step_size=1, gamma=0.1), named]


def _asgd(module: Any) -> Any:
    return torch.optim.ASGD(module.parameters(), lr=0.05)


CASES = {
    # (configure_optimizers, LearningRateMonitor kwargs, manual optimisation, accumulate_grad_batches)
    "step_scheduler_groups": (_sgd_groups, {"log_momentum": True, "log_weight_decay": True}, False, 1),
    "step_scheduler_by_epoch": (_sgd_groups, {"logging_interval": "epoch"}, False, 2),
    "two_adams_named_manual": (_two_adams_named, {"log_momentum": True}, True, 1),
    "two_adams_named_step": (_two_adams_named, {"logging_interval": "step"}, True, 1),
    "no_momentum": (_asgd, {"log_momentum": True}, False, 1),
}


def run_case(name: str, case: str) -> dict[str, Any]:
    framework, callbacks, loggers = _framework(name)
    base = framework.LightningModule if name == "lightning" else framework.TrainingModule
    configure, kwargs, manual, accumulate = CASES[case]

    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.first = nn.Linear(4, 4)
            self.second = nn.Linear(4, 1)
            self.automatic_optimization = not manual

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = nn.functional.mse_loss(self.second(self.first(x)), y)
            if not manual:
                return loss
            for optimizer in self.optimizers():
                optimizer.zero_grad()
            self.manual_backward(loss)
            for optimizer in self.optimizers():
                optimizer.step()
            return None

        def on_train_epoch_end(self) -> None:
            if manual:
                for scheduler in self.lr_schedulers():
                    scheduler.step()

        def configure_optimizers(self) -> Any:
            return configure(self)

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(24, 4, generator=generator)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    monitor = callbacks.LearningRateMonitor(**kwargs)
    with tempfile.TemporaryDirectory() as folder:
        logger = loggers.CSVLogger(folder)
        trainer = framework.Trainer(
            accelerator="cpu",
            devices=1,
            max_epochs=2,
            log_every_n_steps=2,
            accumulate_grad_batches=accumulate,
            logger=logger,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[monitor],
        )
        torch.manual_seed(0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(Net(), data)
        logger.save()
        import csv

        with open(logger.experiment.metrics_file_path, newline="") as file:
            logged = [
                (int(row["step"]), key, float(value))
                for row in csv.DictReader(file)
                for key, value in row.items()
                if value and (key.startswith(("lr-", "my_rate")))
            ]
    return {
        "lrs": monitor.lrs,
        "momentum": monitor.last_momentum_values,
        "weight_decay": monitor.last_weight_decay_values,
        "logged": logged,
        "warned": any("momentum" in str(warning.message) for warning in caught),
    }


def run_all(name: str) -> dict[str, Any]:
    return {case: run_case(name, case) for case in CASES}


if __name__ == "__main__":
    torch.save(run_all(sys.argv[1]), sys.argv[2])
