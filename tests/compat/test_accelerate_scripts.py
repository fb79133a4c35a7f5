"""Accelerate's own test scripts, run on drivetrain in 1 and 2 CPU processes (the conformance suite).

Each case runs one script from the installed accelerate package (pinned in ``constraints.txt``,
cached in ``.compat-venv``) with :mod:`runner` — in one process, or in two under
``drivetrain launch -n 2`` — and compares every sub-test's status with :mod:`manifest`. The last
test writes ``docs/accelerate-conformance.md`` from the run and fails if the committed page was
different (commit the regenerated page).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from helpers.scripts import clean_env, run_command

sys.path.insert(0, str(Path(__file__).resolve().parent))

import accelerate_package
import outcomes
import runner
import table
from manifest import SCRIPTS, Script

pytestmark = pytest.mark.compat

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "docs" / "accelerate-conformance.md"
WORLD_SIZES = (1, 2)
CASES = [(script, size) for script in SCRIPTS for size in WORLD_SIZES]
TIMEOUT = 360

_results: dict[tuple[str, int], list[outcomes.Cell]] = {}


@pytest.fixture(scope="session")
def package() -> Path:
    return accelerate_package.accelerate_package()


def _planned(script: Script, package: Path) -> list[str]:
    source = (package / script.path).read_text()
    names = runner.subtests_of(source, script.helpers)
    return names + [e.function for e in script.extras if e.function not in names]


def _run(script: Script, world_size: int, package: Path, workdir: Path) -> list[outcomes.Cell]:
    results = workdir / "results"
    arguments = ["--package", str(package), "--script", script.name, "--results", str(results)]
    if world_size == 1:
        command = [sys.executable, str(Path(runner.__file__)), *arguments]
    else:
        command = [
            sys.executable,
            "-m",
            "drivetrain",
            "launch",
            "-n",
            str(world_size),
            str(Path(runner.__file__)),
            *arguments,
        ]
    completed = run_command(command, timeout=TIMEOUT, env=clean_env(), cwd=workdir)
    merged = outcomes.merge(outcomes.read_records(results), world_size)
    found = outcomes.cells(script, world_size, merged, _planned(script, package))
    problems = outcomes.unexpected(script, world_size, found)
    if completed.returncode != 0:
        problems.append(f"the run exited with {completed.returncode}")
    _results[(script.name, world_size)] = found
    assert not problems, (
        "\n".join(problems)
        + f"\n--- stdout ---\n{completed.stdout[-6000:]}\n--- stderr ---\n{completed.stderr[-12000:]}"
    )
    return found


@pytest.mark.parametrize(
    ("script", "world_size"),
    [
        pytest.param(
            script, size, id=f"{script.name}-{size}", marks=[pytest.mark.multiprocess] if size > 1 else []
        )
        for script, size in CASES
    ],
)
def test_accelerate_script(script: Script, world_size: int, package: Path, tmp_path: Path) -> None:
    if world_size in script.script_not_applicable:
        _results[(script.name, world_size)] = outcomes.cells(
            script, world_size, {}, _planned(script, package)
        )
        return
    _run(script, world_size, package, tmp_path)


def test_conformance_table_is_current(package: Path, request: pytest.FixtureRequest) -> None:
    missing = [
        f"{name}-{size}" for name, size in ((s.name, w) for s, w in CASES) if (name, size) not in _results
    ]
    # Cases this process was given (not deselected with -k) but never ran went to another
    # pytest-xdist worker: the table would go unchecked in every run, so that is a failure.
    selected = {
        item.name.removeprefix("test_accelerate_script[").removesuffix("]") for item in request.session.items
    }
    elsewhere = [case for case in missing if case in selected]
    assert not elsewhere, (
        f"{elsewhere} ran in another pytest-xdist worker; run this module whole on one (--dist loadfile, "
        f"as scripts/test does) or without workers."
    )
    if missing:
        pytest.skip(f"the table needs every case of this module in the same run; missing {missing}")
    text = table.render(accelerate_package.pinned_version(), _results, WORLD_SIZES)
    before = TABLE.read_text() if TABLE.exists() else None
    TABLE.write_text(text)
    assert before == text, f"{TABLE} was out of date; it is now rewritten from this run: commit it."
