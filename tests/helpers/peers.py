"""Running a script under real PyTorch Lightning (the benchmarks' peers venv) as a test oracle."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers.scripts import run_command


def peers_python() -> Path:
    """The peers venv's interpreter (built on first use); skips the test where it cannot be built."""
    from benchmarks.peers import ensure_peers_venv

    try:
        return ensure_peers_venv(log=lambda _: None)
    except (subprocess.CalledProcessError, OSError) as error:
        pytest.skip(f"the peers' environment with PyTorch Lightning cannot be built here: {error}")


def lightning_results_file(
    script: Path, label: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """``script lightning OUT`` run under Lightning once per script version (kept in pytest's cache)."""
    python = peers_python()
    key = hashlib.sha256(script.read_bytes() + str(python).encode()).hexdigest()[:16]
    cache = getattr(request.config, "cache", None)
    out = cache.mkdir(f"{label}-{key}") if cache is not None else tmp_path_factory.mktemp(label)
    results = out / "lightning.pt"
    if not results.exists():
        # pytest-xdist workers may fill the same cache entry at once: each writes its own file, and the
        # rename publishes whichever finishes last (both hold the same results).
        fresh = out / f"new-{os.getpid()}.pt"
        completed = run_command([str(python), str(script), "lightning", str(fresh)], timeout=300)
        assert completed.returncode == 0, completed.stderr[-3000:]
        fresh.replace(results)
    return results


def lightning_results(
    script: Path, label: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """What ``script lightning OUT`` saved under Lightning (see :func:`lightning_results_file`)."""
    loaded: dict[str, Any] = torch.load(
        lightning_results_file(script, label, request, tmp_path_factory), weights_only=True
    )
    return loaded


def drivetrain_results(script: Path) -> dict[str, Any]:
    """``script``'s ``run_all("drivetrain")``, run in this process: the same program on drivetrain."""
    spec = importlib.util.spec_from_file_location(f"{script.stem}_program", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results: dict[str, Any] = module.run_all("drivetrain")
    return results
