"""An exception on one rank ends the whole job within seconds, with that rank's traceback, in every launch mode.

The failing rank must never enter a collective on its way out (the others are inside other
collectives and would never meet it there), and the report names it as the cause.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest

from faults.jobs import Job, load_scaled, report

pytestmark = [pytest.mark.multiprocess, pytest.mark.faults]

#: From the moment rank 1 raises to the end of the job's last process.
EXIT_BOUND_SECONDS = 30

#: How each launch mode says which rank failed.
NAMED = {
    "script": r"rank 1 \(pid \d+\) exited with code 1 after RuntimeError: injected failure",
    "ddp_spawn": r"ProcessFailedError: rank 1 \(pid \d+\) failed:\s+Traceback",
    "ddp_fork": r"ProcessFailedError: rank 1 \(pid \d+\) failed:\s+Traceback",
    "drivetrain launch": r"drivetrain launch: .* failed: rank 1 \(pid \d+\) exited with code 1 after RuntimeError: "
    r"injected failure on rank 1 at step 3",
    "torchrun": r"RuntimeError: injected failure on rank 1 at step 3",
}


@pytest.mark.parametrize(
    ("mode", "door", "rank"),
    [
        ("script", "accelerator", 1),
        ("script", "accelerator", 0),
        ("ddp_spawn", "trainer", 1),
        ("ddp_spawn", "accelerator", 1),
        ("ddp_fork", "trainer", 1),
        ("drivetrain launch", "trainer", 1),
        ("torchrun", "accelerator", 1),
    ],
)
def test_an_error_on_one_rank_ends_the_job_and_names_the_rank(
    launch: Callable[..., Job], mode: str, door: str, rank: int
) -> None:
    job = launch(mode, door, "raise", FAULT_RANK=str(rank))
    code, _, err = job.wait(timeout=90)
    ended = time.time()
    assert code != 0
    assert f"RuntimeError: injected failure on rank {rank} at step 3" in err, err
    if rank == 1:
        assert re.search(NAMED[mode], err), err
    seconds = ended - float((job.directory / "fault").read_text())
    bound = load_scaled(EXIT_BOUND_SECONDS)
    report(f"error on rank {rank}: {mode}, {door}", 1, int(seconds < bound), seconds)
    assert seconds < bound, (
        f"the job took {seconds:.1f} s to end after rank {rank} failed (bound {bound:.0f} s)"
    )


def test_the_cause_is_named_when_the_launcher_exits_while_its_report_is_still_being_written(
    launch: Callable[..., Job],
) -> None:
    """Script launcher: a watcher thread reports the failed rank while rank 0 ends on its own error.

    Rank 0 waits at the fault step until rank 1 has ended (FAULT_PAUSE), then fails in its next
    collective and exits while the report of rank 1 is still being written (a slow log sink):
    the report must still come out, before the process ends.
    """
    job = launch("script", "accelerator", "raise", FAULT_RANK="1", FAULT_PAUSE="2", SLOW_LOG="4")
    code, _, err = job.wait(timeout=90)
    assert code != 0
    assert re.search(NAMED["script"], err), err
