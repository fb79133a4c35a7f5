"""kill -9 at a random moment: of one rank, or of the launcher. Every process of the job is gone within seconds.

A killed rank ends the job and is named as the cause (by how it ended: SIGKILL); a killed
launcher takes its ranks with it (none trains on as an orphan). The moment is drawn from a
seeded generator (``DRIVETRAIN_FAULTS_SEED``), within the first seconds of training;
``DRIVETRAIN_FAULTS_TRIALS`` repeats each case (1 by default, to keep CI fast).
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from faults.jobs import (
    LAUNCH_MODES,
    PROGRAM,
    Job,
    alive,
    load_scaled,
    report,
    session_processes,
    wait_until_gone,
)
from helpers.scripts import clean_env, run_command

pytestmark = [pytest.mark.multiprocess, pytest.mark.faults]

TRIALS = int(os.environ.get("DRIVETRAIN_FAULTS_TRIALS", "1"))
SEED = int(os.environ.get("DRIVETRAIN_FAULTS_SEED", "15"))
#: From the kill to the end of the job's last process.
GONE_BOUND_SECONDS = 20

#: How each launch mode names a killed rank 1 as the cause.
NAMED = {
    "script": r"rank 1 \(pid {pid}\) was killed by SIGKILL",
    "ddp_spawn": r"ProcessFailedError: rank 1 \(pid {pid}\) was killed by SIGKILL",
    "drivetrain launch": r"drivetrain launch: .* failed: rank 1 \(pid {pid}\) was killed by SIGKILL",
}


def _moments(case: str) -> list[float]:
    generator = random.Random(f"{SEED}-{case}")
    return [generator.uniform(0.0, 1.5) for _ in range(TRIALS)]


@pytest.mark.parametrize(
    ("mode", "door"), [("script", "trainer"), ("ddp_spawn", "accelerator"), ("drivetrain launch", "trainer")]
)
def test_a_rank_killed_at_a_random_moment_ends_the_job_and_is_named(
    launch: Callable[..., Job], mode: str, door: str
) -> None:
    worst, passes = 0.0, 0
    for delay in _moments(f"rank-{mode}"):
        job = launch(mode, door, "train")
        pids = job.rank_pids()
        time.sleep(delay)
        os.kill(pids[1], signal.SIGKILL)
        killed = time.monotonic()
        bound = load_scaled(GONE_BOUND_SECONDS)
        code, _, err = job.wait(timeout=90)
        seconds = wait_until_gone([*session_processes(job.session), *pids.values()], bound) + (
            time.monotonic() - killed
        )
        assert code != 0
        assert re.search(NAMED[mode].format(pid=pids[1]), err), err
        assert seconds < bound, (
            f"the job took {seconds:.1f} s (bound {bound:.0f} s) to end after rank 1 was killed"
        )
        worst, passes = max(worst, seconds), passes + 1
    report(f"kill -9 of rank 1: {mode}, {door}", TRIALS, passes, worst)


@pytest.mark.parametrize(
    ("mode", "door"),
    [
        ("script", "accelerator"),
        ("ddp_spawn", "trainer"),
        ("drivetrain launch", "accelerator"),
        ("torchrun", "trainer"),
    ],
)
def test_ranks_die_with_their_launcher_killed_at_a_random_moment(
    launch: Callable[..., Job], mode: str, door: str
) -> None:
    worst, passes = 0.0, 0
    for delay in _moments(f"launcher-{mode}"):
        job = launch(mode, door, "train")
        pids = job.rank_pids()
        ranks = [pid for pid in pids.values() if pid != job.process.pid]
        time.sleep(delay)
        os.kill(job.process.pid, signal.SIGKILL)
        bound = load_scaled(GONE_BOUND_SECONDS)
        seconds = wait_until_gone(ranks, bound)
        survivors = [pid for pid in ranks if alive(pid)]
        assert not survivors, f"ranks {survivors} outlived their killed launcher ({mode})"
        worst, passes = max(worst, seconds), passes + 1
    report(f"kill -9 of the launcher: {mode}, {door}", TRIALS, passes, worst)


def _children_running_the_program(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and PROGRAM.encode() in command:
            found.append(int(entry.name))
    return found


def test_ranks_exit_when_torchrun_is_killed_while_they_start(launch: Callable[..., Job]) -> None:
    """The agent dies before the ranks reach the rendezvous: an orphan must not wait for it (or train on)."""
    worst, passes = 0.0, 0
    for delay in _moments("torchrun-starting"):
        job = launch("torchrun", "trainer", "train")
        ranks: list[int] = []
        deadline = time.monotonic() + 90
        while len(ranks) < 2 and time.monotonic() < deadline and job.process.poll() is None:
            ranks = _children_running_the_program(job.process.pid)
            time.sleep(0.01)
        assert len(ranks) == 2, f"torchrun did not start its 2 ranks: {ranks}"
        time.sleep(delay / 3)  # somewhere in their start: the interpreter, the imports, the setup
        assert not list(job.directory.glob("rank*.pid")), "the ranks started training before the kill"
        os.kill(job.process.pid, signal.SIGKILL)
        bound = load_scaled(GONE_BOUND_SECONDS)
        seconds = wait_until_gone(ranks, bound)
        survivors = [pid for pid in ranks if alive(pid)]
        for pid in survivors:  # they left torchrun's session: the fixture would not find them
            os.kill(pid, signal.SIGKILL)
        assert not survivors, f"ranks {survivors} outlived torchrun, killed while they started"
        _, _, err = job.wait(timeout=30)  # the ranks wrote to torchrun's stderr, which they inherited
        said = re.findall(r"the launcher is gone \(.*?\); rank (\d) \(pid (\d+)\) stops too", err)
        assert sorted(int(rank) for rank, _ in said) == [0, 1], err
        assert {int(pid) for _, pid in said} == set(ranks), err
        worst, passes = max(worst, seconds), passes + 1
    report("kill -9 of torchrun while its ranks start: trainer", TRIALS, passes, worst)


def _unshare_works() -> bool:
    try:
        done = subprocess.run(["unshare", "-Urpf", "--mount-proc", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="needs unshare with user and pid namespaces")
def test_torchrun_as_a_containers_first_process_is_not_taken_for_a_lost_launcher(tmp_path: Path) -> None:
    """In a container (a pid namespace) torchrun may be pid 1 itself: its ranks' parent is 1 from the start."""
    command = ["unshare", "-Urpf", "--mount-proc", *LAUNCH_MODES["torchrun"], "trainer", "ddp", "none"]
    done = run_command([*command, str(tmp_path)], timeout=120, env=clean_env(OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr
    assert "finished rank=1" in done.stdout, done.stderr
