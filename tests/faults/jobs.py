"""Start the fault program in each launch mode, watch its processes, and record the figures.

A job runs in its own session, so every process it starts can be found (and, on a test failure,
killed) through the session. Figures of each test (trials, passes, worst time to the end of the
job) are appended to the file named by ``DRIVETRAIN_FAULTS_REPORT`` when it is set;
``docs/reliability.md`` shows them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from helpers.scripts import clean_env

PROGRAM = str(Path(__file__).parent / "fault_program.py")

#: How each launch mode starts the 2-rank program (``{door}`` and the rest are filled in).
LAUNCH_MODES = {
    "script": [sys.executable, PROGRAM],
    "ddp_spawn": [sys.executable, PROGRAM],
    "ddp_fork": [sys.executable, PROGRAM],
    "drivetrain launch": [sys.executable, "-m", "drivetrain", "launch", "-n", "2", PROGRAM],
    "torchrun": [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        PROGRAM,
    ],
}
#: The strategy name the program is given in each launch mode.
STRATEGY = {"script": "ddp", "ddp_spawn": "ddp_spawn", "ddp_fork": "ddp_fork"}


@dataclass
class Job:
    """A running fault program: its launcher process and where its ranks report."""

    process: subprocess.Popen[str]
    directory: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def session(self) -> int:
        return self.process.pid

    def rank_pids(self, world_size: int = 2, timeout: float = 90) -> dict[int, int]:
        """The pid of every rank, once all of them have started training."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            files = [self.directory / f"rank{rank}.pid" for rank in range(world_size)]
            if all(f.exists() and f.read_text() for f in files):
                return {rank: int(f.read_text()) for rank, f in enumerate(files)}
            if self.process.poll() is not None:
                out, err = self.process.communicate()
                raise AssertionError(f"the job ended before its ranks started:\n{out}\n{err}")
            time.sleep(0.05)
        self.kill()
        raise AssertionError(f"the ranks did not start within {timeout:.0f} s")

    def wait(self, timeout: float) -> tuple[int, str, str]:
        """``(exit code, stdout, stderr)``; the test fails (after killing everything) on a timeout."""
        try:
            out, err = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            out, err = self.process.communicate()
            raise AssertionError(f"the job did not end within {timeout:.0f} s:\n{out}\n{err}") from None
        return self.process.returncode, out, err

    def kill(self) -> None:
        """Kill every process of the job: its session, and ranks that left it (torchrun starts new sessions)."""
        ranks = [int(f.read_text()) for f in self.directory.glob("rank*.pid") if f.read_text()]
        ranks = [pid for pid in ranks if _runs_the_program(pid)]  # not a recycled pid
        for pid in [*session_processes(self.session), *ranks]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def start(mode: str, door: str, fault: str, directory: Path, **env: str) -> Job:
    """Start the fault program under launch ``mode`` with front door ``door`` and ``fault``."""
    strategy = STRATEGY.get(mode, "ddp")
    command = [*LAUNCH_MODES[mode], door, strategy, fault, str(directory)]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(OMP_NUM_THREADS="1", **env),
        start_new_session=True,
    )
    return Job(process, directory)


def session_processes(session: int) -> list[int]:
    """Live (not zombie) processes of a session (the job's launcher and every process under it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, sid = fields[0], int(fields[3])
        if sid == session and state != "Z":
            found.append(int(entry.name))
    return found


def _runs_the_program(pid: int) -> bool:
    try:
        return PROGRAM.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_until_gone(pids: list[int], timeout: float) -> float:
    """Seconds until none of ``pids`` is alive; ``inf`` if some still are after ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if not any(alive(pid) for pid in pids):
            return time.monotonic() - started
        time.sleep(0.02)
    return float("inf")


#: The jobs' hang limit (``Job.wait``'s timeout in these tests); a scaled bound stays below it, so a
#: job that only ends when something times out still fails the bound.
HANG_SECONDS = 90


def load_scaled(seconds: float) -> float:
    """A bound on how long a job takes to end, stretched by how busy the machine is right now.

    The bounds are set for an idle machine; with other tests running beside (pytest-xdist, a busy
    CI host) every process is slower by about the load per core. The bound grows by that factor,
    never to :data:`HANG_SECONDS` or beyond.
    """
    per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    return min(seconds * max(1.0, per_core), HANG_SECONDS - 10)


def report(test: str, trials: int, passes: int, worst_seconds: float, **extra: object) -> None:
    """Add this test's figures to the report file, when one is asked for."""
    path = os.environ.get("DRIVETRAIN_FAULTS_REPORT")
    if not path:
        return
    line = {"test": test, "trials": trials, "passes": passes, "worst_s": round(worst_seconds, 2), **extra}
    with open(path, "a") as file:
        file.write(json.dumps(line) + "\n")


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Job]]:
    """``launch(mode, door, fault, **env)`` starts the fault program in a directory under ``tmp_path``.

    Every job started is killed, with all its processes, when the test ends, however it ends.
    """
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
        try:
            job.process.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # an orphan we could not find holds the pipes
            job.process.kill()
