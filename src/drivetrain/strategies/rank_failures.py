"""How a failing rank tells its peers and the launcher why it leaves, so the root cause is named.

When a rank leaves with an exception it writes a *failure record* to the job's rendezvous store
before its connections close. A peer whose collective then breaks, and the launcher that sees
the processes end, find the cause already there: the report names the rank that failed first,
however the race between the failing rank's exit and its peers' errors goes. A failure that is
only the consequence of losing a peer (a broken connection in a collective) is marked
*secondary*, so it never hides the rank that started it.

Under torchrun the record also goes to torchrun's error file (``TORCHELASTIC_ERROR_FILE``, the
format of ``torch.distributed.elastic``), which ``drivetrain launch`` and torchrun itself read.
"""

from __future__ import annotations

import json
import os
import signal
import time
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: Messages of the backends' errors when a peer's connection broke or the group was aborted.
_LOST_PEER_MESSAGES = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "connectFullMesh failed",
    "NCCL communicator was aborted",
    "has been aborted",
)
_MAX_TRACEBACK_CHARS = 20_000


@dataclass(frozen=True)
class FailureRecord:
    """Why one rank left the job.

    Attributes:
        rank: the global rank that failed.
        pid: its process id.
        summary: ``"ExceptionType: message"``.
        traceback: the formatted traceback (possibly shortened).
        secondary: the failure only followed from losing another rank.
        order: the position of this failure among the job's failures (1 is the first recorded).
    """

    rank: int
    pid: int
    summary: str
    traceback: str
    secondary: bool
    order: int

    def describe(self) -> str:
        """``rank R (pid P) failed with Type: message``."""
        return f"rank {self.rank} (pid {self.pid}) failed with {self.summary}"


def is_lost_peer(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) says a peer rank went away."""
    from drivetrain.strategies.launchers.launcher import ProcessFailedError

    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ProcessFailedError):
            return True
        text = str(current)
        if any(message in text for message in _LOST_PEER_MESSAGES):
            return True
        current = current.__cause__ or current.__context__
    return False


def _keys(namespace: str) -> tuple[str, str]:
    base = f"drivetrain/{namespace}/failures"
    return f"{base}/count", base


def record_failure(store: Any, namespace: str, rank: int, error: BaseException) -> FailureRecord | None:
    """Write ``error`` as ``rank``'s failure record to ``store``; ``None`` when the store is unreachable.

    Never raises: this runs while the process is already failing, and must not hide the error.
    """
    summary = _summary(error)
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    text = text if len(text) <= _MAX_TRACEBACK_CHARS else "…" + text[-_MAX_TRACEBACK_CHARS:]
    secondary = is_lost_peer(error)
    count_key, base = _keys(namespace)
    try:
        order = int(store.add(count_key, 1))
        payload = {
            "rank": rank,
            "pid": os.getpid(),
            "summary": summary,
            "traceback": text,
            "secondary": secondary,
        }
        store.set(f"{base}/{order}", json.dumps(payload))
    except Exception:  # the store's host is gone (rank 0 or the launcher died first)
        return None
    return FailureRecord(rank, os.getpid(), summary, text, secondary, order)


def read_failures(store: Any, namespace: str) -> list[FailureRecord]:
    """Every failure record of the job, in the order they were written (empty if unreachable)."""
    count_key, base = _keys(namespace)
    records = []
    try:
        count = int(store.add(count_key, 0))
        for order in range(1, count + 1):
            key = f"{base}/{order}"
            if not store.check([key]):  # counted, not yet written: its writer is still at it
                continue
            data = json.loads(store.get(key))
            records.append(
                FailureRecord(
                    int(data["rank"]),
                    int(data["pid"]),
                    str(data["summary"]),
                    str(data["traceback"]),
                    bool(data["secondary"]),
                    order,
                )
            )
    except Exception:
        return records
    return records


def root_cause(
    records: Iterable[FailureRecord],
    ended: Iterable[tuple[int, int]] = (),
    stop_signal: int = signal.SIGTERM,
) -> tuple[int, FailureRecord | None] | None:
    """The rank whose failure started the others', and its record if it left one.

    Args:
        records: the job's failure records (:func:`read_failures`).
        ended: ``(rank, exit code)`` of processes the caller saw end, in the order it saw them.
        stop_signal: the signal the caller itself stops surviving ranks with; a rank ended by it
            is a casualty, not a cause.

    In order of precedence: the first rank that raised an error of its own; a rank that died
    without a word (killed by a signal, ``os._exit``, ``SystemExit``, a crash in native code); a
    rank that the caller stopped while it was ending that way (when every recorded failure is
    only a lost peer, the peer is among the silent ones); the first rank that failed only
    because it lost a peer; else the first rank that ended.
    """
    records = list(records)
    ended = [(rank, code) for rank, code in ended if code != 0]
    primary = [r for r in records if not r.secondary]
    if primary:
        first = min(primary, key=lambda r: r.order)
        return first.rank, first
    recorded = {r.rank for r in records}
    silent = [(rank, code) for rank, code in ended if rank not in recorded]
    for rank, code in silent:
        if code != -stop_signal:
            return rank, None
    if records and silent:
        return silent[0][0], None
    if records:
        first = min(records, key=lambda r: r.order)
        return first.rank, first
    return (ended[0][0], None) if ended else None


def write_torchelastic_error_file(path: str, error: BaseException, record: FailureRecord | None) -> None:
    """Write ``error`` into torchrun's per-rank error file, in ``torch.distributed.elastic``'s format.

    The ``drivetrain`` entry adds what torchrun's own format lacks: whether the failure was
    secondary, and its order among the job's failures (torchrun's timestamps have a resolution
    of one second, too coarse to order ranks that fail together).
    """
    if os.path.exists(path):
        return  # written already (by torch's @record, or an earlier failure of this process)
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    data: dict[str, Any] = {
        "message": {
            "message": _summary(error),
            "extraInfo": {"py_callstack": text, "timestamp": str(int(time.time()))},
        },
        "drivetrain": {
            "secondary": is_lost_peer(error) if record is None else record.secondary,
            "order": None if record is None else record.order,
            "time_ns": time.time_ns(),
        },
    }
    try:
        with open(path, "w") as file:
            json.dump(data, file)
    except OSError:
        pass


def drivetrain_error_data(error_file_data: Mapping[str, Any]) -> tuple[bool, int | None, int | None]:
    """``(secondary, order, time_ns)`` from an error file :func:`write_torchelastic_error_file` wrote."""
    extra = error_file_data.get("drivetrain")
    if not isinstance(extra, Mapping):
        return False, None, None
    order, stamp = extra.get("order"), extra.get("time_ns")
    return (
        bool(extra.get("secondary")),
        order if isinstance(order, int) else None,
        stamp if isinstance(stamp, int) else None,
    )


def _summary(error: BaseException) -> str:
    message = str(error).strip().splitlines()
    first = message[0] if message else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__
