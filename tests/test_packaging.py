"""What ``pip install drivetrain`` brings: dependencies, extras, the version, and ``drivetrain env``'s extras report."""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

import pytest
import tomllib

import drivetrain
from drivetrain.cli.env import describe_environment, extras_status
from helpers.scripts import run_command

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def _names(requirements: list[str]) -> set[str]:
    return {re.match(r"[A-Za-z0-9._-]+", r).group(0).lower() for r in requirements}  # type: ignore[union-attr]


def test_a_base_install_brings_numpy_and_pyyaml() -> None:
    # Without numpy torch warns on every import; without PyYAML hparams.yaml could not be YAML.
    installed = [r for r in importlib.metadata.requires("drivetrain") or [] if "extra ==" not in r]
    assert {"torch", "numpy", "pyyaml", "tqdm", "safetensors"} <= _names(installed)


def test_the_version_has_one_source_and_the_command_prints_it() -> None:
    assert importlib.metadata.version("drivetrain") == drivetrain.__version__
    assert "version" in PROJECT["dynamic"]
    result = run_command([sys.executable, "-m", "drivetrain", "--version"], timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"drivetrain {drivetrain.__version__}"


def test_tracker_and_plot_extras_and_an_all_extra_that_holds_every_wheel_extra() -> None:
    extras = PROJECT["optional-dependencies"]
    assert _names(extras["wandb"]) == {"wandb"}
    assert "mlflow-skinny" in _names(extras["mlflow"])
    assert _names(extras["plot"]) == {"matplotlib"}
    (grouped,) = extras["all"]
    members = set(re.fullmatch(r"drivetrain\[(.*)\]", grouped).group(1).split(","))  # type: ignore[union-attr]
    # deepspeed ships as source only (a compiler, Linux); examples, dev and docs are not features.
    assert members == set(extras) - {"all", "dev", "docs", "examples", "deepspeed"}
    # The test suite exercises every tracker, so CI installs them through dev.
    for extra in ("tensorboard", "wandb", "mlflow", "plot", "cli"):
        assert _names(extras[extra]) <= _names(extras["dev"]), extra
    # CI builds the docs site and runs its guides (tests/docs_site), so dev holds the docs extra too.
    assert _names(extras["docs"]) <= _names(extras["dev"])


def test_classifiers_and_no_invented_urls() -> None:
    assert "Programming Language :: Python :: 3.11" in PROJECT["classifiers"]
    assert "License :: OSI Approved :: Apache Software License" in PROJECT["classifiers"]
    assert "urls" not in PROJECT  # none is known yet; better none than made-up ones


def test_env_reports_each_extra_as_installed_or_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    report = describe_environment()
    listed = report.split("Optional extras (pip install 'drivetrain[NAME]'):\n", 1)[1].splitlines()
    names = [line.split()[0] for line in listed]
    assert names == [e for e in PROJECT["optional-dependencies"] if e not in ("all", "dev", "docs")]
    tensorboard_line = next(line for line in listed if line.split()[0] == "tensorboard")
    assert f"installed (tensorboard {importlib.metadata.version('tensorboard')})" in tensorboard_line

    real_version = importlib.metadata.version

    def version_without_wandb(name: str) -> str:
        if name == "wandb":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", version_without_wandb)
    assert extras_status()["wandb"] == {"wandb": None}
    wandb_line = next(line for line in describe_environment().splitlines() if line.split()[:1] == ["wandb"])
    assert wandb_line.split() == ["wandb", "missing:", "wandb"]
