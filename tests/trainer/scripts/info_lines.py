"""Lightning's info lines for several Trainer settings, on Lightning or on drivetrain (only the imports differ).

``python info_lines.py lightning OUT.pt`` saves, per case, the info messages of the families drivetrain
writes too (limits, fast_dev_run, barebones, anomaly detection, devices, why a fit stopped, checkpoint
restores); the test runs the same cases on drivetrain and compares them line by line.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import warnings
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FAMILIES = (
    "`Trainer(",
    "Running in `fast_dev_run`",
    "You are running in `Trainer(barebones=True)` mode.",
    "You have turned on `Trainer(detect_anomaly=True)`",
    "GPU available:",
    "TPU available:",
    "Using 16bit",
    "Using bfloat16",
    "`Trainer.fit` stopped:",
    "Restoring states",
    "Restored all states",
    "Loaded model weights",
)

CASES: dict[str, dict[str, Any]] = {
    "limits_one": {
        "limit_train_batches": 1,
        "limit_val_batches": 1,
        "limit_test_batches": 1,
        "val_check_interval": 1,
    },
    "limits_all": {"limit_train_batches": 1.0, "limit_predict_batches": 1.0, "val_check_interval": 1.0},
    "max_steps": {"max_steps": 3, "limit_train_batches": 2},
    "fast_dev_run": {"fast_dev_run": 2},
    "barebones": {"barebones": True, "max_epochs": 1},
    "anomaly_bf16": {"detect_anomaly": True, "precision": "bf16-mixed", "max_epochs": 1},
}


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.lstrip().startswith(FAMILIES) and message.strip() not in self.lines[-1:]:
            self.lines.append(message.strip())


def _net(framework: Any, name: str) -> Any:
    base = framework.LightningModule if name == "lightning" else framework.TrainingModule

    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            pass

        def test_step(self, batch: Any, batch_idx: int) -> None:
            pass

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Net()


def run_all(name: str) -> dict[str, list[str]]:
    if name == "lightning":
        import lightning.pytorch as framework
    else:
        import drivetrain as framework
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(16, 4, generator=generator)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    collect = _Collect()
    # Lightning's loggers do not propagate to the root; drivetrain's do (its own handler then stays quiet).
    listened = [
        logging.getLogger(),
        logging.getLogger("lightning.pytorch"),
        logging.getLogger("lightning.fabric"),
    ]
    for logger in listened:
        logger.addHandler(collect)
    logging.getLogger().setLevel(logging.INFO)
    results: dict[str, list[str]] = {}
    common = {"accelerator": "cpu", "devices": 1, "logger": False, "enable_progress_bar": False}
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case, settings in CASES.items():
            collect.lines = []
            extra = (
                {}
                if "barebones" in settings
                else {"enable_model_summary": False, "enable_checkpointing": False}
            )
            trainer = framework.Trainer(**common, **extra, **{"max_epochs": 2, **settings})
            trainer.fit(_net(framework, name), data, data)
            if case == "limits_one":
                trainer.test(_net(framework, name), data, verbose=False)
            results[case] = collect.lines
        collect.lines = []
        path = os.path.join(folder, "model.ckpt")
        trainer = framework.Trainer(
            **common, max_epochs=1, enable_model_summary=False, enable_checkpointing=False
        )
        model = _net(framework, name)
        trainer.fit(model, data)
        trainer.save_checkpoint(path)
        resumed = framework.Trainer(
            **common, max_epochs=2, enable_model_summary=False, enable_checkpointing=False
        )
        resumed.fit(_net(framework, name), data, ckpt_path=path)
        resumed.validate(_net(framework, name), data, ckpt_path=path, verbose=False)
        results["resume"] = [line.replace(folder, "<folder>") for line in collect.lines]
    for logger in listened:
        logger.removeHandler(collect)
    return results


if __name__ == "__main__":
    torch.save(run_all(sys.argv[1]), sys.argv[2])
