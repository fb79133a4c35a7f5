"""``SimpleProfiler``: wall time of every action, as a table of calls, mean and total."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

from drivetrain.profilers.profiler import Profiler


class SimpleProfiler(Profiler):
    """Times each action with ``time.perf_counter``; the summary lists actions by total time.

    Args:
        dirpath: see :class:`Profiler`.
        filename: see :class:`Profiler`.
        extended: also show the number of calls and each action's share of the run's time.
    """

    def __init__(
        self, dirpath: str | Path | None = None, filename: str | None = None, extended: bool = True
    ) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.extended = extended
        self.current_actions: dict[str, float] = {}
        self.recorded_durations: dict[str, list[float]] = defaultdict(list)
        self._started = time.perf_counter()

    def setup(
        self, stage: str, global_rank: int = 0, world_size: int = 1, log_dir: str | None = None
    ) -> None:
        super().setup(stage, global_rank, world_size, log_dir)
        self.current_actions.clear()
        self.recorded_durations.clear()
        self._started = time.perf_counter()

    def start(self, action_name: str) -> None:
        if action_name in self.current_actions:
            raise ValueError(
                f"The profiler action {action_name!r} was started twice without a stop in between."
            )
        self.current_actions[action_name] = time.perf_counter()

    def stop(self, action_name: str) -> None:
        end = time.perf_counter()
        start = self.current_actions.pop(action_name, None)
        if start is None:
            raise ValueError(f"The profiler action {action_name!r} was stopped but never started.")
        self.recorded_durations[action_name].append(end - start)

    def summary(self) -> str:
        if not self.recorded_durations:
            return ""
        total = time.perf_counter() - self._started
        rows = sorted(
            ((name, sum(times), len(times)) for name, times in self.recorded_durations.items()),
            key=lambda row: row[1],
            reverse=True,
        )
        header: tuple[str, ...]
        table: list[tuple[str, ...]]
        if self.extended:
            header = ("Action", "Mean duration (s)", "Num calls", "Total time (s)", "Percentage %")
            table = [("Total", "-", str(sum(calls for _, _, calls in rows)), f"{total:.5f}", "100 %")]
            table += [
                (name, f"{spent / calls:.5f}", str(calls), f"{spent:.5f}", f"{100 * spent / total:.3f}")
                for name, spent, calls in rows
            ]
        else:
            header = ("Action", "Mean duration (s)", "Total time (s)")
            table = [(name, f"{spent / calls:.5f}", f"{spent:.5f}") for name, spent, calls in rows]
        widths = [max(len(row[i]) for row in [header, *table]) for i in range(len(header))]

        def line(cells: tuple[str, ...]) -> str:
            return "|  " + "  |  ".join(cell.ljust(width) for cell, width in zip(cells, widths)) + "  |"

        rule = "-" * len(line(header))
        title = f"{(self._stage or 'run').upper()} Profiler Report"
        return "\n".join([title, rule, line(header), rule, *(line(row) for row in table), rule])
