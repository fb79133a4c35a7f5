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
import time
from collections.abc import Callable

import pytest

from faults.jobs import Job, alive, report, session_processes, wait_until_gone

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
        code, _, err = job.wait(timeout=90)
        seconds = wait_until_gone([*session_processes(job.session), *pids.values()], GONE_BOUND_SECONDS) + (
            time.monotonic() - killed
        )
        assert code != 0
        assert re.search(NAMED[mode].format(pid=pids[1]), err), err
        assert seconds < GONE_BOUND_SECONDS, f"the job took {seconds:.1f} s to end after rank 1 was killed"
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
        seconds = wait_until_gone(ranks, GONE_BOUND_SECONDS)
        survivors = [pid for pid in ranks if alive(pid)]
        assert not survivors, f"ranks {survivors} outlived their killed launcher ({mode})"
        worst, passes = max(worst, seconds), passes + 1
    report(f"kill -9 of the launcher: {mode}, {door}", TRIALS, passes, worst)
