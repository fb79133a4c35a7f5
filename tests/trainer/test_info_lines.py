"""Lightning's info lines ("`Trainer(limit_train_batches=1)` was configured so ...", "`Trainer.fit` stopped: ...")
for the settings drivetrain shares, against real PyTorch Lightning 2.6: the same lines in the same order.

``scripts/info_lines.py`` runs on the peers' interpreter (an oracle; results cached by the script's content) and
here on drivetrain. The one word that differs: the barebones line names ``TrainingModule.log``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from helpers import peers
from trainer.trainer_models import Regression, loader, quiet_trainer

SCRIPT = Path(__file__).parent / "scripts" / "info_lines.py"


@pytest.fixture(scope="module")
def lightning_lines(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    return peers.lightning_results(SCRIPT, "info-lines", request, tmp_path_factory)


@pytest.fixture(scope="module")
def drivetrain_lines() -> dict[str, Any]:
    return peers.drivetrain_results(SCRIPT)


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
