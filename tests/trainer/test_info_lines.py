"""Lightning's info lines ("`Trainer(limit_train_batches=1)` was configured so ...", "`Trainer.fit` stopped: ...")
for the settings drivetrain shares, against real PyTorch Lightning 2.6: the same lines in the same order.

``scripts/info_lines.py`` runs on the peers' interpreter (an oracle; results cached by the script's content) and
here on drivetrain. The one word that differs: the barebones line names ``TrainingModule.log``.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers.peers import lightning_results_file
from trainer.trainer_models import Regression, loader, quiet_trainer

SCRIPT = Path(__file__).parent / "scripts" / "info_lines.py"


@pytest.fixture(scope="module")
def lightning_lines(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    loaded: dict[str, Any] = torch.load(
        lightning_results_file(SCRIPT, "info-lines", request, tmp_path_factory), weights_only=True
    )
    return loaded


@pytest.fixture(scope="module")
def drivetrain_lines() -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location("info_lines_program", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lines: dict[str, Any] = module.run_all("drivetrain")
    return lines


@pytest.mark.parametrize(
    "case", ["limits_one", "limits_all", "max_steps", "fast_dev_run", "barebones", "anomaly_bf16", "resume"]
)
def test_the_same_info_lines_as_lightning(
    case: str, lightning_lines: dict[str, Any], drivetrain_lines: dict[str, Any]
) -> None:
    theirs = [line.replace("LightningModule.log", "TrainingModule.log") for line in lightning_lines[case]]
    assert drivetrain_lines[case] == theirs
    assert any("was configured so" in line or "stopped" in line or "Restor" in line for line in theirs)


def test_the_lines_are_info_messages_that_a_level_silences(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="drivetrain"):
        quiet_trainer(limit_train_batches=1, max_epochs=1).fit(Regression(), loader())
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "drivetrain.trainer"]
    assert (
        logging.INFO,
        "`Trainer(limit_train_batches=1)` was configured so 1 batch per epoch will be used.",
    ) in lines
    assert (logging.INFO, "`Trainer.fit` stopped: `max_epochs=1` reached.") in lines
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="drivetrain"):
        quiet_trainer(limit_train_batches=1, max_epochs=1).fit(Regression(), loader())
    assert not [r for r in caplog.records if "was configured so" in r.getMessage()]
