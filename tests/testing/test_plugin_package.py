"""The minimal plugin package of docs/extending.md builds, installs, registers by entry point, and passes the kit.

The package's files are the page's own code blocks. It is built into a wheel and installed into a
folder of its own (never the project's environment); the processes below find it on their path.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from docs_site.code_blocks import code_blocks, write_page_files
from helpers.scripts import REPO, clean_env, run_command


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs' averaging_plugin, built and installed into a target folder; that folder."""
    root = tmp_path_factory.mktemp("plugin-package")
    page = REPO / "docs" / "extending.md"
    written = write_page_files(
        [
            b
            for b in code_blocks(page.read_text(), str(page))
            if (b.title or "").startswith("averaging_plugin/")
        ],
        root,
    )
    assert {p.relative_to(root).as_posix() for p in written} == {
        "averaging_plugin/pyproject.toml",
        "averaging_plugin/averaging_plugin/__init__.py",
    }
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    built = run_command(
        [
            *pip,
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(root / "dist"),
            str(root / "averaging_plugin"),
        ],
        env=clean_env(),
        timeout=240,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (root / "dist").glob("averaging_plugin-0.1.0-*.whl")
    target = root / "site"
    installed = run_command(
        [*pip, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
        env=clean_env(),
        timeout=240,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert (target / "averaging_plugin" / "__init__.py").exists()
    return target


def _env(target: Path) -> dict[str, str]:
    return clean_env(PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(target)]), OMP_NUM_THREADS="1")


def test_the_installed_package_provides_its_strategy_by_name_alone(installed: Path) -> None:
    code = (
        "import sys, drivetrain as dt; "
        "assert 'averaging_plugin' not in sys.modules; "
        "strategy = dt.connect(accelerator='cpu', strategy='averaging', devices=1); "
        "print(type(strategy).__module__, type(strategy).__name__)"
    )
    result = run_command([sys.executable, "-c", code], env=_env(installed), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["averaging_plugin", "AveragingStrategy"]


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_the_kit_checks_the_installed_package(installed: Path, tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "drivetrain",
        "check-plugin",
        "averaging_plugin",
        "--processes",
        "2",
        "--root",
        str(tmp_path),
    ]
    result = run_command(command, env=_env(installed), timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    text = result.stdout
    assert (
        "drivetrain plugin check: AveragingStrategy (averaging) (strategy):" in text and " 0 failed" in text
    )
    for row in (
        "Trainer, 2 processes: save, kill, resume bit-exactly",
        "Accelerator, 2 processes: save_state, kill, load_state bit-exactly",
        "2 processes: the strategy's collectives (all_reduce, all_gather, broadcas",
        "2 processes: strategy='averaging' in every process",
        "CLI: python train.py fit --trainer.accelerator=cpu --trainer.strategy=averaging --trainer.devices=2",
    ):
        line = next(
            (line for line in text.splitlines() if line.startswith(row[:60])), None
        )  # long names are cut
        assert line is not None and line.rstrip().endswith("passed"), f"{row}:\n{text}"
