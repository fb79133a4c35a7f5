"""A LightningCLI program with only its imports changed runs on drivetrain.cli.CLI and gives Lightning's results.

The program (iris_cli_program.py, in the style of MLflow's IrisClassification example) passes no
seed: the results agree only because both CLIs seed by default, with 0. Lightning runs in the
peers' environment (skipped where it cannot be built).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers.peers import peers_python
from helpers.scripts import run_command, run_script

PROGRAM = Path(__file__).parent / "iris_cli_program.py"
ARGS = ["--trainer.accelerator=cpu", "--model.hidden=12"]


def _lightning_results(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    python = peers_python()
    key = hashlib.sha256(PROGRAM.read_bytes() + str(ARGS).encode() + str(python).encode()).hexdigest()[:16]
    cache = getattr(request.config, "cache", None)
    out = cache.mkdir(f"iris-cli-{key}") if cache is not None else tmp_path_factory.mktemp("iris-cli")
    results = out / "lightning.pt"
    if not results.exists():
        fresh = out / f"new-{os.getpid()}.pt"  # xdist workers may fill the same entry at once
        completed = run_command([str(python), str(PROGRAM), "lightning", str(fresh), *ARGS], timeout=300)
        assert completed.returncode == 0, completed.stderr[-3000:]
        fresh.replace(results)
    loaded: dict[str, Any] = torch.load(results, weights_only=True)
    return loaded


@pytest.mark.timeout(400)
def test_an_iris_lightningcli_program_gives_lightnings_metrics_unseeded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    theirs = _lightning_results(request, tmp_path_factory)
    completed = run_script(
        [str(PROGRAM), "drivetrain", str(tmp_path / "ours.pt"), *ARGS], cwd=tmp_path, timeout=240
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    ours: dict[str, Any] = torch.load(tmp_path / "ours.pt", weights_only=True)
    assert ours["hidden"] == theirs["hidden"] == 12
    assert (
        ours["callbacks"]
        == theirs["callbacks"]
        == ["EarlyStopping", "LearningRateMonitor", "ModelCheckpoint"]
    )
    assert ours["global_step"] == theirs["global_step"]
    assert ours["test"][0].keys() == theirs["test"][0].keys()
    for name, value in theirs["test"][0].items():
        assert ours["test"][0][name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    # Lightning's LearningRateMonitor also puts the rates into callback_metrics; drivetrain's only logs them.
    shared = {name for name in theirs["fit"] if not name.startswith("lr-")}
    assert shared <= ours["fit"].keys()
    for name in shared:
        assert ours["fit"][name] == pytest.approx(theirs["fit"][name], rel=1e-5, abs=1e-6), name
    # Nothing was written beside the checkpoints: save_config_callback=None.
    assert not list(tmp_path.rglob("config.yaml"))
