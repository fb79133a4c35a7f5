"""``AdvancedProfiler``: ``cProfile`` statistics for every action."""

from __future__ import annotations

import cProfile
import io
import pstats
from pathlib import Path

from drivetrain.profilers.profiler import Profiler


class AdvancedProfiler(Profiler):
    """Runs a ``cProfile.Profile`` per action; the summary shows each action's functions by cumulative time.

    Only one profiler can collect at a time, so a nested action (``training_step`` inside
    ``run_training_batch``) pauses the enclosing one: each action's statistics cover the code
    that ran outside the actions nested in it.

    Args:
        dirpath: see :class:`Profiler`.
        filename: see :class:`Profiler`.
        line_count_restriction: how many functions to show per action (an int), or a fraction of them.
    """

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        line_count_restriction: int | float = 1.0,
    ) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        if isinstance(line_count_restriction, bool) or not isinstance(line_count_restriction, (int, float)):
            raise TypeError(
                f"line_count_restriction expects an int or a fraction, got {line_count_restriction!r}."
            )
        self.line_count_restriction = line_count_restriction
        self.profiled_actions: dict[str, cProfile.Profile] = {}
        self._active: list[str] = []

    def setup(
        self, stage: str, global_rank: int = 0, world_size: int = 1, log_dir: str | None = None
    ) -> None:
        super().setup(stage, global_rank, world_size, log_dir)
        self.profiled_actions.clear()
        self._active.clear()

    def start(self, action_name: str) -> None:
        if action_name in self._active:
            raise ValueError(
                f"The profiler action {action_name!r} was started twice without a stop in between."
            )
        if self._active:
            self.profiled_actions[self._active[-1]].disable()
        profile = self.profiled_actions.get(action_name)
        if profile is None:
            profile = self.profiled_actions[action_name] = cProfile.Profile()
        self._active.append(action_name)
        profile.enable()

    def stop(self, action_name: str) -> None:
        if not self._active or self._active[-1] != action_name:
            raise ValueError(
                f"The profiler action {action_name!r} was stopped but is not the innermost running one "
                f"({self._active[-1] if self._active else 'none'!r})."
            )
        self.profiled_actions[self._active.pop()].disable()
        if self._active:
            self.profiled_actions[self._active[-1]].enable()

    def summary(self) -> str:
        reports = []
        for action, profile in self.profiled_actions.items():
            stream = io.StringIO()
            stats = pstats.Stats(profile, stream=stream)
            stats.strip_dirs().sort_stats("cumulative").print_stats(self.line_count_restriction)
            reports.append(f"Profile stats for: {action}\n{stream.getvalue()}")
        if not reports:
            return ""
        return f"{(self._stage or 'run').upper()} Profiler Report\n\n" + "\n".join(reports)

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state["profiled_actions"] = {}  # cProfile objects cannot be pickled (a spawned rank starts afresh)
        state["_active"] = []
        return state
