"""``AdvancedProfiler``: ``cProfile`` statistics for every action."""

from __future__ import annotations

import cProfile
import io
import marshal
import pstats
import re
from pathlib import Path

from drivetrain._utilities import paths
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
        dump_stats: also write each action's raw statistics, for ``pstats``/snakeviz, to
            ``{dirpath}/{stage}-{filename}-{rank}-{action}.prof`` (Lightning's names; the rank only with
            several processes) when the report is made. Needs ``dirpath`` (or ``filename``, which
            writes into the Trainer's ``log_dir``).
    """

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        line_count_restriction: int | float = 1.0,
        dump_stats: bool = False,
    ) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        if not isinstance(dump_stats, bool):
            raise TypeError(f"AdvancedProfiler(dump_stats={dump_stats!r}); use True or False.")
        if dump_stats and dirpath is None and filename is None:
            raise ValueError(
                "AdvancedProfiler(dump_stats=True) writes .prof files into dirpath: pass dirpath=, or filename= to "
                "write them into the Trainer's log_dir."
            )
        self.dump_stats = dump_stats
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
            if self.dump_stats:
                self._dump(action, profile)
            stream = io.StringIO()
            stats = pstats.Stats(profile, stream=stream)
            stats.strip_dirs().sort_stats("cumulative").print_stats(self.line_count_restriction)
            reports.append(f"Profile stats for: {action}\n{stream.getvalue()}")
        if not reports:
            return ""
        return f"{(self._stage or 'run').upper()} Profiler Report\n\n" + "\n".join(reports)

    def _dump(self, action: str, profile: cProfile.Profile) -> None:
        """``profile``'s raw statistics, in the format ``pstats.Stats`` reads, to this action's ``.prof`` file."""
        assert self.dirpath is not None  # checked when built; set from log_dir by setup() otherwise
        parts = [self._stage, self.filename, str(self._rank) if self._world_size > 1 else None, action]
        name = re.sub(r"_+", "_", re.sub(r'[\\/:*?"<>|\n\r\t]', "_", "-".join(p for p in parts if p)))
        paths.makedirs(self.dirpath)
        profile.create_stats()
        with paths.open_file(paths.join(self.dirpath, f"{name.strip() or 'profile'}.prof"), "wb") as file:
            marshal.dump(profile.stats, file)  # what Profile.dump_stats writes

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state["profiled_actions"] = {}  # cProfile objects cannot be pickled (a spawned rank starts afresh)
        state["_active"] = []
        return state
