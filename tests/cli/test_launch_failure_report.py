"""How ``drivetrain launch`` names the rank that ended a job, from torchrun's own failure records.

The records are torch.distributed.elastic's real ``ProcessFailure`` objects, built from error
files as torchrun builds them (or from no error file, as for a rank ended by a signal).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from drivetrain.cli.launch import describe_failures


def _failure(tmp_path: Path, rank: int, pid: int, exitcode: int, error: dict | None = None) -> ProcessFailure:
    path = tmp_path / f"error-{rank}.json"
    if error is not None:
        path.write_text(json.dumps(error))
    return ProcessFailure(local_rank=rank, pid=pid, exitcode=exitcode, error_file=str(path))


def _lost_peer_file(order: int) -> dict:
    return {
        "message": {
            "message": "ProcessFailedError: a peer process is gone",
            "extraInfo": {"py_callstack": "", "timestamp": str(int(time.time()))},
        },
        "drivetrain": {"secondary": True, "order": order, "time_ns": time.time_ns()},
    }


def test_a_killed_rank_is_the_cause_when_the_launcher_stopped_the_other_before_it_wrote_anything(
    tmp_path: Path,
) -> None:
    # Under load torchrun's SIGTERM reaches rank 0 before rank 0 notices its lost peer: neither
    # rank wrote an error file, and torchrun fills in a "<NONE>" placeholder for both.
    failures = {
        0: _failure(tmp_path, 0, 100, -signal.SIGTERM),
        1: _failure(tmp_path, 1, 101, -signal.SIGKILL),
    }
    assert failures[0].error_file_data == {"message": "<NONE>"}  # torch's placeholder, as seen in CI
    text = describe_failures(failures)
    assert text.startswith("failed: rank 1 (pid 101) was killed by SIGKILL"), text
    assert "<NONE>" not in text
    assert "rank 0 was stopped by the launcher" in text


def test_a_killed_rank_is_the_cause_when_the_other_only_lost_its_peer(tmp_path: Path) -> None:
    failures = {
        0: _failure(tmp_path, 0, 100, 1, _lost_peer_file(order=1)),
        1: _failure(tmp_path, 1, 101, -signal.SIGKILL),
    }
    text = describe_failures(failures)
    assert text.startswith("failed: rank 1 (pid 101) was killed by SIGKILL"), text


def test_a_rank_that_raised_its_own_error_is_the_cause_with_its_message(tmp_path: Path) -> None:
    own = _lost_peer_file(order=1)
    own["message"]["message"] = "ValueError: bad batch"
    own["drivetrain"]["secondary"] = False
    failures = {
        0: _failure(tmp_path, 0, 100, -signal.SIGTERM),
        1: _failure(tmp_path, 1, 101, 1, own),
    }
    text = describe_failures(failures)
    assert text.startswith("failed: rank 1 (pid 101) exited with code 1 after ValueError: bad batch"), text
