"""The development install (scripts/bootstrap, scripts/install): uv given the torch pip would take."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINKS = REPO / ".venv" / ".torch-find-links"


def _pinned_torch() -> str:
    text = (REPO / "constraints.txt").read_text()
    match = re.search(r"^torch==(\S+)", text, flags=re.MULTILINE)
    assert match, "constraints.txt pins torch"
    return match.group(1)


def test_the_installer_names_a_missing_interpreter() -> None:
    done = subprocess.run(
        [str(REPO / "scripts" / "install"), "/nonexistent/bin/python", "six"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "must be a virtual environment's python (got '/nonexistent/bin/python')" in done.stderr


def test_uv_installed_the_torch_build_pip_takes_from_this_machines_disk() -> None:
    folder = LINKS.read_text().strip() if LINKS.exists() else ""
    if not folder:
        pytest.skip("pip takes the pinned torch from an index here, so scripts/install used pip")
    pin = _pinned_torch()
    on_disk = sorted(Path(folder).glob(f"torch-{pin}*.whl"))
    assert on_disk, f"{LINKS} names {folder}, which holds no torch {pin} wheel"
    local = on_disk[0].name.split("-")[1].replace("%2B", "+")
    torch = importlib.metadata.distribution("torch")
    # Without the folder uv would take PyPI's build of the same version (no local label). (A venv
    # made before scripts/install used uv keeps pip's torch: the build is what matters.)
    assert torch.version == local
    # The peers' environment, where built, runs the same build.
    peers = REPO / "benchmarks" / ".peers-venv"
    for info in peers.glob("lib/python3*/site-packages/torch-*.dist-info"):
        assert info.name == f"torch-{local}.dist-info"
