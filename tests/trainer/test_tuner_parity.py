"""The Tuner against real PyTorch Lightning: one program, only the imports differ.

``scripts/tuner_parity.py`` runs on the peers' interpreter (``benchmarks/.peers-venv``, built on first use; its
results cached by the script's content) and here on drivetrain: the range test tries the same rates, records the
same smoothed losses, stops at the same step and suggests the same rate; the batch-size search finds the same
sizes after the same out-of-memory errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers import peers

SCRIPT = Path(__file__).parent / "scripts" / "tuner_parity.py"


@pytest.fixture(scope="module")
def lightning_results(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    return peers.lightning_results(SCRIPT, "tuner-parity", request, tmp_path_factory)


@pytest.fixture(scope="module")
def drivetrain_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return peers.drivetrain_results(SCRIPT)


@pytest.mark.parametrize("mode", ["exponential", "linear"])
def test_lr_find_tries_the_same_rates_and_suggests_the_same_one(
    mode: str, lightning_results: dict[str, Any], drivetrain_results: dict[str, Any]
) -> None:
    ours, theirs = drivetrain_results[f"lr_find_{mode}"], lightning_results[f"lr_find_{mode}"]
    assert len(ours["lr"]) == len(theirs["lr"]) and len(ours["loss"]) == len(theirs["loss"])
    assert ours["lr"] == pytest.approx(theirs["lr"], rel=1e-6)
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-4, nan_ok=True)
    assert ours["suggestion"] == pytest.approx(theirs["suggestion"], rel=1e-6)
    assert ours["attribute"] == pytest.approx(theirs["attribute"], rel=1e-6)


@pytest.mark.parametrize("mode", ["power", "binsearch"])
def test_scale_batch_size_finds_the_same_size(
    mode: str, lightning_results: dict[str, Any], drivetrain_results: dict[str, Any]
) -> None:
    assert drivetrain_results[f"scale_{mode}"] == lightning_results[f"scale_{mode}"]
