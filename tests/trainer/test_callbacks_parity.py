"""The averaging, fine-tuning and pruning callbacks against real PyTorch Lightning: one program, only the imports differ.

``scripts/callbacks_parity.py`` runs on the peers' interpreter (``benchmarks/.peers-venv``, built on first use;
its results cached by the script's content) and here on drivetrain: the final weights and the learning rates of
every epoch agree. StochasticWeightAveraging's rates agree; its weights differ by design (drivetrain averages the
weights at the end of each SWA epoch, Lightning at the start: docs/migrating-from-lightning.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import peers

SCRIPT = Path(__file__).parent / "scripts" / "callbacks_parity.py"


@pytest.fixture(scope="module")
def lightning_results(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    return peers.lightning_results(SCRIPT, "callbacks-parity", request, tmp_path_factory)


@pytest.fixture(scope="module")
def drivetrain_results() -> dict[str, Any]:
    return peers.drivetrain_results(SCRIPT)


@pytest.mark.parametrize("case", ["weight_averaging", "ema", "backbone", "pruning_global", "pruning_local"])
def test_the_same_weights_and_rates_as_lightning(
    case: str, lightning_results: dict[str, Any], drivetrain_results: dict[str, Any]
) -> None:
    ours, theirs = drivetrain_results[case], lightning_results[case]
    _same_rates(ours["rates"], theirs["rates"])
    assert ours["weights"].keys() == theirs["weights"].keys()  # no pruning reparametrisation left in either
    for key, value in theirs["weights"].items():
        torch.testing.assert_close(ours["weights"][key], value, msg=key)


def test_swa_anneals_the_rate_as_lightning_does(
    lightning_results: dict[str, Any], drivetrain_results: dict[str, Any]
) -> None:
    rates = drivetrain_results["swa"]["rates"]
    _same_rates(rates, lightning_results["swa"]["rates"])
    assert rates[0] != rates[-1] and rates[-1] == pytest.approx([0.01])


def _same_rates(ours: list[list[float]], theirs: list[list[float]]) -> None:
    """Per epoch, the rate of every parameter group."""
    assert [len(groups) for groups in ours] == [len(groups) for groups in theirs]
    assert [lr for groups in ours for lr in groups] == pytest.approx(
        [lr for groups in theirs for lr in groups]
    )
