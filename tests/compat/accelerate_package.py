"""The installed ``accelerate`` package whose portable test scripts the conformance suite runs.

Accelerate ships its test scripts inside its wheel (``accelerate/test_utils/scripts/...``). They
are installed into a separate virtual environment, ``.compat-venv`` at the repository root
(git-ignored; ``DRIVETRAIN_COMPAT_VENV`` moves it), never into the project's ``.venv``. The
version is the one pinned in ``constraints.txt``. The scripts run on drivetrain's interpreter with
their ``accelerate`` imports redirected (``hook.py``), so the environment only has to hold
accelerate's files: it is installed without its dependencies (no second torch, ~5 s instead of a
minute), with ``-c constraints.txt`` so the pin applies. Beside it go the libraries Accelerate's
scripts use when they are present (:data:`USER_PACKAGES`: ``datasets``), with their dependencies,
so that the scripts take the paths users with those libraries installed take; the scripts'
interpreter sees them after its own packages (:func:`add_user_packages`), so drivetrain's
dependencies are never replaced by the environment's copies. The first test of a run builds it;
every later test and run reuses it after checking the version.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONSTRAINTS = REPO / "constraints.txt"
VENV_VARIABLE = "DRIVETRAIN_COMPAT_VENV"
#: Libraries Accelerate's scripts and utilities use when present (``split_between_processes`` of a
#: ``datasets.Dataset``, say), installed with their dependencies. ``datasets`` also brings
#: ``huggingface_hub``, which Accelerate's own code (its ``accelerate config``) imports.
USER_PACKAGES = ("datasets",)


def pinned_version(constraints: Path = CONSTRAINTS) -> str:
    """The ``accelerate==X`` pin of ``constraints.txt``."""
    for line in constraints.read_text().splitlines():
        match = re.fullmatch(r"\s*accelerate\s*==\s*([\w.]+)\s*(#.*)?", line)
        if match:
            return match.group(1)
    raise RuntimeError(f"{constraints} pins no accelerate version (expected a line 'accelerate==X.Y.Z').")


def venv_path() -> Path:
    return Path(os.environ.get(VENV_VARIABLE, REPO / ".compat-venv"))


def _site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise RuntimeError(f"{venv} has no lib/python3*/site-packages; delete it and run again.")
    return found[0]


def _installed_version(site_packages: Path) -> str | None:
    for info in site_packages.glob("accelerate-*.dist-info"):
        return info.name.removeprefix("accelerate-").removesuffix(".dist-info")
    return None


def _has_user_packages(site_packages: Path) -> bool:
    return all(any(site_packages.glob(f"{name}-*.dist-info")) for name in USER_PACKAGES)


def _install(python: Path, *arguments: str) -> None:
    # scripts/install: uv where this machine's pip configuration can be carried over to it, else
    # pip; then the environment is byte-compiled on every core.
    subprocess.run(
        [str(REPO / "scripts" / "install"), str(python), "--quiet", *arguments], check=True, timeout=600
    )


def accelerate_package(log: object = None) -> Path:
    """The directory holding the pinned ``accelerate`` package (its parent goes on no path).

    Creates or repairs the cached environment when it lacks the pinned version or one of
    :data:`USER_PACKAGES`.
    """
    version = pinned_version()
    venv = venv_path()
    python = venv / "bin" / "python"
    if python.exists():
        site = _site_packages(venv)
        if _installed_version(site) == version and _has_user_packages(site):
            return site / "accelerate"
    else:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    started = time.perf_counter()
    _install(python, "--no-deps", "-c", str(CONSTRAINTS), f"accelerate=={version}")
    _install(python, "-c", str(CONSTRAINTS), *USER_PACKAGES)
    site = _site_packages(venv)
    if _installed_version(site) != version:
        raise RuntimeError(f"installing accelerate=={version} into {venv} left {_installed_version(site)!r}.")
    if callable(log):
        log(f"accelerate {version} installed into {venv} in {time.perf_counter() - started:.1f} s")
    return site / "accelerate"


def add_user_packages(package: Path) -> None:
    """Make :data:`USER_PACKAGES` importable in this process (``package``: :func:`accelerate_package`'s).

    The environment's folder goes at the end of ``sys.path``: this interpreter's own packages
    (torch, numpy, fsspec …) keep precedence, and the environment adds only what it lacks.
    """
    site = str(package.parent)
    if site not in sys.path:
        sys.path.append(site)
