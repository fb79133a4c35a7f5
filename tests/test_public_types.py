"""The public names are their real classes to a type checker, and both front doors take connect()'s types.

The package roots import their names lazily (``import drivetrain`` stays cheap), which hides them
from type checkers unless they are also imported under ``TYPE_CHECKING``. These tests run mypy on a
user's snippet, as an IDE or CI would, and compare what it sees with what Python imports.
"""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src" / "drivetrain"
# Packages whose names are imported on first use (a module-level __getattr__).
LAZY_PACKAGES = tuple(
    ".".join(init.parent.relative_to(SOURCE.parent).parts)
    for init in sorted(SOURCE.rglob("__init__.py"))
    if "__getattr__" in init.read_text()
)

# What a user passes to any door, and calls that must be type errors (marked by a comment).
DOOR_IMPORTS = """
from drivetrain.accelerators import CPUAccelerator
from drivetrain.plugins import LocalEnvironment, MixedPrecision, TorchCheckpointIO
from drivetrain.strategies import DDPStrategy
"""
DOOR_CALLS = """
{door}(accelerator="cpu", strategy="ddp", devices=2, num_nodes=1, precision="bf16-mixed", plugins=None)
{door}(accelerator=CPUAccelerator(), strategy=DDPStrategy(), devices=[0, 1], precision=16)
{door}(precision=MixedPrecision("bf16-mixed", device="cpu"), plugins=[LocalEnvironment(), TorchCheckpointIO(), "64-true"])
{door}(plugins=LocalEnvironment())
{door}(accelerator=3)  # error
{door}(strategy=DDPStrategy)  # error
{door}(precision=1.5)  # error
{door}(plugins=[object()])  # error
{door}(devices=2.0)  # error
"""


def _run_mypy(tmp_path: Path, code: str) -> list[str]:
    snippet = tmp_path / "user_code.py"
    snippet.write_text(code)
    # The project's settings and cache (scripts/check fills it before the tests run in CI): a cold run
    # analyses torch again, which takes minutes on a loaded machine.
    repo = SOURCE.parents[1]
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(repo / "pyproject.toml"),
            "--cache-dir",
            str(repo / ".mypy_cache"),
            "--no-error-summary",
            str(snippet),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert "Cannot find implementation" not in completed.stdout, completed.stdout
    return completed.stdout.splitlines()


def _public_names() -> list[tuple[str, str]]:
    return [(package, name) for package in LAZY_PACKAGES for name in importlib.import_module(package).__all__]


def test_lazily_imported_public_names_are_their_real_classes_to_mypy(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    names = [(package, name) for package, name in _public_names() if name != "__version__"]
    lines = ["import drivetrain as dt", *(f"import {package}" for package in LAZY_PACKAGES)]
    lines += [f"reveal_type({package}.{name})" for package, name in names]
    lines += DOOR_IMPORTS.strip().splitlines()
    for door in ("dt.connect", "dt.Trainer", "dt.Accelerator"):
        lines += DOOR_CALLS.format(door=door).strip().splitlines()
    output = _run_mypy(tmp_path, "\n".join(lines) + "\n")

    revealed = {}
    for line in output:
        match = re.match(r".*user_code\.py:(\d+): note: Revealed type is \"(.*)\"$", line)
        if match:
            revealed[int(match.group(1))] = match.group(2)
    first = len(LAZY_PACKAGES) + 2
    problems = []
    for offset, (package, name) in enumerate(names):
        seen = revealed.get(first + offset)
        value = getattr(importlib.import_module(package), name)
        if seen is None or seen == "Any":
            problems.append(f"{package}.{name} is {seen!r} to mypy")
        elif inspect.isclass(value) and f"-> {value.__module__}.{value.__qualname__}" not in seen:
            problems.append(
                f"{package}.{name} is {seen!r} to mypy, but {value.__module__}.{value.__qualname__} at run time"
            )
    assert not problems, "\n".join(problems)

    errors = [line for line in output if ": error:" in line]
    error_lines = {int(re.match(r".*user_code\.py:(\d+):", line).group(1)) for line in errors}  # type: ignore[union-attr]
    code_lines = "\n".join(lines).splitlines()
    expected = {number for number, text in enumerate(code_lines, start=1) if text.endswith("# error")}
    assert error_lines == expected, "\n".join(errors)

    # The same wrong argument is refused with the same expected type by every door.
    wanted: dict[str, dict[str, str]] = {}
    for line in errors:
        match = re.search(r'Argument "(\w+)" to "(\w+)" has incompatible type ".*"; expected "(.*)"', line)
        if match:
            argument, door, expected_type = match.groups()
            wanted.setdefault(argument, {})[door] = expected_type.removesuffix(" | None")
        elif "List item 0" in line:
            wanted.setdefault("plugins", {})[line.split(":")[1]] = line.split("expected")[1]
    assert set(wanted) == {"accelerator", "strategy", "precision", "devices", "plugins"}
    for argument, by_door in wanted.items():
        assert len(by_door) == 3 and len(set(by_door.values())) == 1, f"{argument}: {by_door}"
