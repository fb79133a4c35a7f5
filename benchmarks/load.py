"""How busy the machine is around each case: recorded in the results, with a warning when too busy.

Taken while the suite itself is idle (between cases), so what it sees is everyone else. Two
views: the kernel's 1-minute load average (smoothed, so it still carries the previous case's own
processes for a minute), and an instant probe over one second — the average number of runnable
tasks other than the probe (``/proc/loadavg``'s fourth field, sampled) and the share of the CPU
time the machine spent busy (``/proc/stat``). The warning goes by the probe: more runnable tasks
than cores means a benchmark process would have had to wait for a core.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Load:
    """One reading: load averages, runnable tasks besides ours, busy share of all cores (0..1)."""

    load_average: tuple[float, float, float] | None
    runnable: float | None
    busy: float | None
    cores: int

    @property
    def too_busy(self) -> bool:
        """More than one runnable task per core besides the suite (None readings never warn)."""
        return self.runnable is not None and self.runnable > self.cores

    def describe(self) -> str:
        parts = []
        if self.runnable is not None:
            parts.append(f"{self.runnable:.1f} runnable tasks besides the suite")
        if self.busy is not None:
            parts.append(f"CPU {self.busy:.0%} busy")
        if self.load_average is not None:
            parts.append("load average " + "/".join(f"{v:.2f}" for v in self.load_average))
        return ", ".join(parts) or "not readable here"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "too_busy": self.too_busy}


def probe(
    seconds: float = 1.0,
    samples: int = 20,
    *,
    read: Callable[[str], str] = lambda path: Path(path).read_text(),
    sleep: Callable[[float], None] = time.sleep,
    cores: int | None = None,
) -> Load:
    """Watch the machine for ``seconds`` (the caller being idle) and return what it saw.

    ``read`` and ``sleep`` are injectable so that tests can feed recorded ``/proc`` contents.
    """
    cores = cores or os.cpu_count() or 1
    try:
        first = _cpu_times(read("/proc/stat"))
        running = []
        for _ in range(samples):
            # Field 4 is "running/total" and counts the reading task itself.
            running.append(int(read("/proc/loadavg").split()[3].split("/")[0]) - 1)
            sleep(seconds / samples)
        last = _cpu_times(read("/proc/stat"))
        averages = tuple(float(v) for v in read("/proc/loadavg").split()[:3])
    except (OSError, ValueError, IndexError):
        return Load(None, None, None, cores)
    busy_delta = (last[0] - first[0]) or 0
    total_delta = (last[1] - first[1]) or 0
    busy = busy_delta / total_delta if total_delta > 0 else None
    return Load(
        (averages[0], averages[1], averages[2]), sum(max(0, r) for r in running) / len(running), busy, cores
    )


def _cpu_times(stat: str) -> tuple[int, int]:
    """(busy, total) jiffies from the ``cpu`` line of ``/proc/stat`` (idle and iowait are not busy)."""
    fields = [int(v) for v in stat.splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    # guest time is already counted in user time; the first eight fields are the disjoint ones.
    total = sum(fields[:8])
    return total - idle, total


def warning(case: str, before: Load, after: Load) -> str | None:
    """The warning to print and keep with the case's results, or None when the machine was quiet."""
    busy = [name for name, load in (("before", before), ("after", after)) if load.too_busy]
    if not busy:
        return None
    worst = max((load.runnable or 0.0) for load in (before, after))
    return (
        f"machine busy {' and '.join(busy)} {case}: up to {worst:.1f} runnable tasks besides the suite on "
        f"{before.cores} cores (more than one per core); its timings are not trustworthy — rerun on a quiet "
        f"machine (instruction counts are not affected)"
    )
