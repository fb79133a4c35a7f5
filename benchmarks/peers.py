"""The peers' own virtual environment: Lightning (with Fabric) and Accelerate, never in the project's.

Created on first use at ``benchmarks/.peers-venv`` (git-ignored) with the same pinned torch as
the project (``constraints.txt``), so that both interpreters run the same torch build and only the
framework differs. drivetrain's own runtime dependencies go in too (not drivetrain itself): the
in-process A/B case runs drivetrain from a source tree on ``PYTHONPATH`` in this interpreter,
beside the peers. Later runs reuse it after a quick check that every package is there.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PEERS_VENV = REPO_ROOT / "benchmarks" / ".peers-venv"
# jsonargparse: LightningCLI's parser, for the tests that run a LightningCLI program under Lightning.
PEER_PACKAGES = ("torch==2.13.0", "lightning", "accelerate", "jsonargparse[signatures]>=4.49")

_PROBE = """
import importlib.metadata as m, json, sys
found = {"python": ".".join(map(str, sys.version_info[:3]))}
for name in sys.argv[1:]:
    try:
        found[name] = m.version(name)
    except m.PackageNotFoundError:
        # Importable from a source tree (PYTHONPATH) without being installed?
        try:
            found[name] = __import__(name).__version__ + " (from source)"
        except Exception:
            found[name] = None
print(json.dumps(found))
"""


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def probe_versions(python: Path | str, packages: Sequence[str]) -> dict[str, str | None]:
    """Python and package versions as ``python`` sees them (None for a missing package)."""
    completed = subprocess.run(
        [str(python), "-c", _PROBE, *packages], capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(completed.stdout)


def drivetrain_requirements(pyproject: Path = REPO_ROOT / "pyproject.toml") -> list[str]:
    """drivetrain's runtime requirements (``[project] dependencies``), as pip takes them."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the installed drivetrain's metadata says the same
        import importlib.metadata

        return [r for r in importlib.metadata.requires("drivetrain") or [] if "extra ==" not in r]
    return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])


def requirement_name(requirement: str) -> str:
    """The distribution name of a requirement string (``"numpy>=1.22"`` -> ``"numpy"``)."""
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0]


def ensure_peers_venv(venv: Path = PEERS_VENV, log: Callable[[str], None] = print) -> Path:
    """Return the peers' interpreter, creating the environment first if it is absent or incomplete."""
    python = venv_python(venv)
    requirements = [*PEER_PACKAGES, *drivetrain_requirements()]
    if python.exists():
        names = sorted({requirement_name(r) for r in requirements})
        versions = probe_versions(python, names)
        if all(versions.values()):
            return python
        log(f"peers' venv at {venv} lacks {[k for k, v in versions.items() if not v]}; installing")
    else:
        log(f"creating the peers' venv at {venv} (one time, ~15-30 s)")
        # The project's interpreter may itself be a venv; `-m venv` builds on its base Python.
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    started = time.perf_counter()
    # scripts/install: uv where this machine's pip configuration can be carried over to it, else pip;
    # then the environment is byte-compiled on every core.
    subprocess.run(
        [
            str(REPO_ROOT / "scripts" / "install"),
            str(python),
            "--quiet",
            "-c",
            str(REPO_ROOT / "constraints.txt"),
            *requirements,
        ],
        check=True,
    )
    log(f"peers installed in {time.perf_counter() - started:.0f} s")
    return python
