"""The peers' venv also gets drivetrain's runtime dependencies (the A/B case runs drivetrain there)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.peers import drivetrain_requirements, requirement_name


def test_drivetrain_requirements_come_from_pyproject(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\nname = "drivetrain"\ndependencies = ["torch>=2.4", "pyyaml>=6.0"]\n'
        '[project.optional-dependencies]\ncli = ["jsonargparse[signatures]>=4.49"]\n'
    )
    assert drivetrain_requirements(pyproject) == ["torch>=2.4", "pyyaml>=6.0"]
    assert "torch>=2.4" in drivetrain_requirements()  # the checkout's own


def test_requirement_names_drop_versions_extras_and_markers() -> None:
    assert requirement_name("numpy>=1.22") == "numpy"
    assert requirement_name("jsonargparse[signatures]>=4.49") == "jsonargparse"
    assert requirement_name("tomli; python_version < '3.11'") == "tomli"
    assert requirement_name("torch==2.13.0") == "torch"
