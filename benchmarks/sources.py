"""Which drivetrain source trees a run measures (``--drivetrain-src NAME=PATH``, repeatable).

Without the option the suite measures the checkout it lives in (``<repo>/src``). With it, every
drivetrain variant runs once per named tree — ``drivetrain_trainer@before``,
``drivetrain_trainer@after`` — in the same rounds as raw PyTorch and the peers, so a before/after
table compares two trees measured in the same conditions, minutes apart at most. The first tree
named is the baseline the others are compared with.

A tree reaches its processes through ``PYTHONPATH`` (ahead of any installed drivetrain), and every
sample reports the ``drivetrain`` module it imported; the harness refuses a sample whose module
came from elsewhere, so a stale install can never stand in for the tree asked for.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class SourceError(ValueError):
    """A ``--drivetrain-src`` value that cannot be used (the message says why and what to pass)."""


@dataclass(frozen=True)
class Source:
    """A drivetrain source tree: ``path`` holds the ``drivetrain`` package; ``name`` is '' for the default."""

    name: str
    path: Path

    @property
    def suffix(self) -> str:
        """Appended to variant names: ``@before``; empty for the default tree."""
        return f"@{self.name}" if self.name else ""

    @property
    def label_suffix(self) -> str:
        return f" [{self.name}]" if self.name else ""

    def owns(self, module_file: str | None) -> bool:
        """Whether an imported ``drivetrain/__init__.py`` at ``module_file`` belongs to this tree."""
        if module_file is None:
            return False
        try:
            Path(module_file).resolve().relative_to(self.path.resolve())
        except ValueError:
            return False
        return True

    def describe(self) -> dict[str, str | None]:
        return {"path": str(self.path), "commit": git_description(self.path)}


def default_source() -> Source:
    """The checkout the suite belongs to."""
    return Source("", REPO_ROOT / "src")


def parse_sources(values: Sequence[str] | None) -> tuple[Source, ...]:
    """``NAME=PATH`` strings to sources; none given means the default tree.

    Raises:
        SourceError: a value without ``=``, a bad or repeated name, a path without ``drivetrain/``.
    """
    if not values:
        return (default_source(),)
    sources: list[Source] = []
    for value in values:
        name, sep, raw_path = value.partition("=")
        if not sep or not name or not raw_path:
            raise SourceError(
                f"--drivetrain-src {value!r}: expected NAME=PATH, e.g. "
                f"--drivetrain-src before=/work/wt/before/src --drivetrain-src after={REPO_ROOT / 'src'}"
            )
        if not _NAME.match(name):
            raise SourceError(
                f"--drivetrain-src {value!r}: the name {name!r} must start with a letter or digit and hold only "
                f"letters, digits, '_', '.' or '-' (it becomes part of variant names such as drivetrain_trainer@{name})"
            )
        if any(s.name == name for s in sources):
            raise SourceError(
                f"--drivetrain-src: the name {name!r} is given twice; give each tree its own name"
            )
        path = Path(raw_path).expanduser().resolve()
        if not (path / "drivetrain" / "__init__.py").is_file():
            hint = ""
            if (path / "src" / "drivetrain" / "__init__.py").is_file():
                hint = f"; did you mean {path / 'src'}?"
            raise SourceError(
                f"--drivetrain-src {value!r}: {path} does not contain drivetrain/__init__.py; pass the directory "
                f"that holds the drivetrain package (a checkout's src/){hint}"
            )
        if any(s.path == path for s in sources):
            raise SourceError(f"--drivetrain-src {value!r}: {path} is already measured under another name")
        sources.append(Source(name, path))
    return tuple(sources)


def git_description(path: Path) -> str | None:
    """``git describe`` of the checkout holding ``path`` (tag or short commit, '-dirty' if edited)."""
    try:
        completed = subprocess.run(
            ["git", "describe", "--tags", "--always", "--dirty"],
            cwd=path,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return None
    return completed.stdout.strip() or None


def trees_that_moved(at_start: dict[str, dict[str, str | None]], sources: Sequence[Source]) -> list[str]:
    """Warnings for trees whose checkout changed during the run (a landing mid-run mixes versions)."""
    moved = []
    for source in sources:
        before, after = at_start[source.name]["commit"], source.describe()["commit"]
        if before != after:
            moved.append(
                f"drivetrain tree {source.name!r} changed during the run ({before} at the start, {after} at the "
                f"end): its samples may come from both versions; rerun with the tree left alone"
            )
    return moved
