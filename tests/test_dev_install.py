"""The development install (scripts/bootstrap, scripts/install): uv given the torch pip would take."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import venv
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


@pytest.mark.parametrize("bytecode", ["", "on-import"])
def test_the_installer_compiles_the_environment_unless_bytecode_is_left_to_imports(
    tmp_path: Path, bytecode: str
) -> None:
    venv.create(tmp_path / "env", with_pip=False)
    [purelib] = (tmp_path / "env" / "lib").glob("python3*/site-packages")
    (purelib / "planted.py").write_text("VALUE = 1\n")
    (tmp_path / "nothing.txt").write_text("")
    env = {**os.environ, "DRIVETRAIN_BYTECODE": bytecode}
    done = subprocess.run(
        [
            str(REPO / "scripts" / "install"),
            str(tmp_path / "env" / "bin" / "python"),
            "-r",
            str(tmp_path / "nothing.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    compiled = [p.name.split(".")[0] for p in (purelib / "__pycache__").glob("*.pyc")]
    # scripts/test leaves bytecode to the imports (DRIVETRAIN_BYTECODE=on-import); every other install compiles.
    assert compiled == ([] if bytecode == "on-import" else ["planted"])
