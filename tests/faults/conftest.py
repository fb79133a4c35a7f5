"""Every job a fault test starts is killed (with all its processes) when the test ends, however it ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from faults.jobs import Job, start


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Job]]:
    """``launch(mode, door, fault, **env)`` starts the fault program; its directory is under ``tmp_path``."""
    started: list[Job] = []

    def launch_job(mode: str, door: str, fault: str, **env: Any) -> Job:
        directory = tmp_path / f"job{len(started)}"
        directory.mkdir()
        job = start(mode, door, fault, directory, **env)
        started.append(job)
        return job

    yield launch_job
    for job in started:
        job.kill()
        job.process.communicate()
