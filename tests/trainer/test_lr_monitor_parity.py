"""LearningRateMonitor against real PyTorch Lightning 2.6: the same names, recorded values and logged steps.

``scripts/lr_monitor_parity.py`` runs on the peers' interpreter (an oracle; results cached by the script's
content) and here on drivetrain, in five configurations: a step scheduler over two parameter groups with
momentum and weight decay, the same by epoch with accumulation, two optimizers of one class with a named
scheduler and a named parameter group (manual optimisation), by step, and an optimizer without momentum.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers import peers

SCRIPT = Path(__file__).parent / "scripts" / "lr_monitor_parity.py"


@pytest.fixture(scope="module")
def lightning_results(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    return peers.lightning_results(SCRIPT, "lr-monitor-parity", request, tmp_path_factory)


@pytest.fixture(scope="module")
def drivetrain_results() -> dict[str, Any]:
    return peers.drivetrain_results(SCRIPT)


@pytest.mark.parametrize(
    "case",
    [
        "step_scheduler_groups",
        "step_scheduler_by_epoch",
        "two_adams_named_manual",
        "two_adams_named_step",
        "no_momentum",
    ],
)
def test_the_same_rates_names_and_steps_as_lightning(
    case: str, lightning_results: dict[str, Any], drivetrain_results: dict[str, Any]
) -> None:
    ours, theirs = drivetrain_results[case], lightning_results[case]
    assert list(ours["lrs"]) == list(theirs["lrs"])
    for name, rates in theirs["lrs"].items():
        assert ours["lrs"][name] == pytest.approx(rates), name
    assert ours["momentum"] == theirs["momentum"] and ours["weight_decay"] == theirs["weight_decay"]
    assert ours["logged"] == theirs["logged"] and ours["warned"] == theirs["warned"]
    assert ours["logged"], "something was logged"
