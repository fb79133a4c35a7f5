"""``PyTorchProfiler``: operator-level profiling with ``torch.profiler``, exported as a Chrome trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from drivetrain.profilers.profiler import Profiler

#: The action that ends one training step: a ``schedule=`` advances there.
STEP_ACTION = "run_training_batch"


class PyTorchProfiler(Profiler):
    """Records every operator with ``torch.profiler.profile``; each action is a ``record_function`` range.

    When the entry point ends, the operator table (``key_averages``) is the summary, and the
    trace is written to ``{dirpath}/{stage}-{filename}.pt.trace.json`` (default folder: the
    Trainer's ``log_dir``; default file name ``trace``; ``-rank{N}`` added in a multi-process run),
    which ``chrome://tracing`` or Perfetto open.

    Args:
        dirpath: folder of the trace and report (default: the Trainer's ``log_dir``).
        filename: base name of the trace (and of the report file, which is otherwise logged).
        export_to_chrome: write the Chrome trace.
        row_limit: rows of the operator table in the summary (-1: all).
        sort_by_key: the table's sort column (default ``"cpu_time_total"``, or ``"cuda_time_total"``
            when CUDA is profiled).
        **profiler_kwargs: passed to ``torch.profiler.profile`` (``record_shapes``, ``profile_memory``,
            ``with_stack``, ``activities``, ``schedule`` …). With a ``schedule``, the profiler advances
            one step per training batch and writes a trace for each recorded cycle.
    """

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        export_to_chrome: bool = True,
        row_limit: int = 20,
        sort_by_key: str | None = None,
        **profiler_kwargs: Any,
    ) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        import inspect

        import torch.profiler

        known = set(inspect.signature(torch.profiler.profile.__init__).parameters) - {"self"}
        unknown = sorted(set(profiler_kwargs) - known)
        if unknown:
            raise TypeError(
                f"PyTorchProfiler got unknown argument(s) {', '.join(map(repr, unknown))}; the extra keyword "
                f"arguments go to torch.profiler.profile, which accepts: {', '.join(sorted(known))}."
            )
        self.export_to_chrome = export_to_chrome
        self.row_limit = row_limit
        self.sort_by_key = sort_by_key
        self.profiler_kwargs = profiler_kwargs
        self._profiler: Any = None
        self._ranges: dict[str, Any] = {}
        self._log_dir: str | None = None
        self._summary = ""
        self._traces = 0
        self._open = False  # between setup and the report: actions outside (teardown hooks) are not recorded
        self.trace_paths: list[Path] = []
        #: The recorded events (``torch.autograd.profiler_util.EventList``) once the report is made: the
        #: whole entry point, or the last cycle of a ``schedule``; ``None`` before (Lightning's name).
        self.function_events: Any = None

    def setup(
        self, stage: str, global_rank: int = 0, world_size: int = 1, log_dir: str | None = None
    ) -> None:
        super().setup(stage, global_rank, world_size, log_dir)
        self._log_dir = log_dir
        self._summary = ""
        self._traces = 0
        self._open = True
        self.function_events = None

    def _trace_path(self) -> Path:
        folder = self.dirpath or self._log_dir or "."
        rank = f"-rank{self._rank}" if self._world_size > 1 else ""
        cycle = f"-{self._traces}" if "schedule" in self.profiler_kwargs else ""
        return Path(folder) / f"{self._stage or 'run'}-{self.filename or 'trace'}{rank}{cycle}.pt.trace.json"

    def _export(self, profiler: Any) -> None:
        path = self._trace_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(path))
        self.trace_paths.append(path)
        self._traces += 1

    def _begin(self) -> None:
        import torch.profiler

        options = dict(self.profiler_kwargs)
        if "schedule" in options and self.export_to_chrome and "on_trace_ready" not in options:
            options["on_trace_ready"] = self._export
        self._profiler = torch.profiler.profile(**options)
        self._profiler.__enter__()

    def start(self, action_name: str) -> None:
        if not self._open:
            return
        if action_name in self._ranges:
            raise ValueError(
                f"The profiler action {action_name!r} was started twice without a stop in between."
            )
        if self._profiler is None:
            self._begin()
        import torch.profiler

        recorded = torch.profiler.record_function(action_name)
        recorded.__enter__()
        self._ranges[action_name] = recorded

    def stop(self, action_name: str) -> None:
        recorded = self._ranges.pop(action_name, None)
        if recorded is None:
            if not self._open:
                return
            raise ValueError(f"The profiler action {action_name!r} was stopped but never started.")
        recorded.__exit__(None, None, None)
        if action_name == STEP_ACTION and "schedule" in self.profiler_kwargs:
            self._profiler.step()

    def _finish(self) -> None:
        self._open = False
        profiler, self._profiler = self._profiler, None
        if profiler is None:
            return
        for recorded in reversed(list(self._ranges.values())):
            recorded.__exit__(None, None, None)
        self._ranges.clear()
        profiler.__exit__(None, None, None)
        self.function_events = _events(profiler)
        if "schedule" not in self.profiler_kwargs:
            if self.export_to_chrome:
                self._export(profiler)
            sort_by = self.sort_by_key or (
                "cuda_time_total"
                if "cuda" in str(self.profiler_kwargs.get("activities", "")).lower()
                else "cpu_time_total"
            )
            table = profiler.key_averages().table(sort_by=sort_by, row_limit=self.row_limit)
            self._summary = f"{(self._stage or 'run').upper()} Profiler Report\n{table}"

    def summary(self) -> str:
        self._finish()
        return self._summary

    def teardown(self, stage: str | None) -> None:
        self._finish()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_profiler"], state["_ranges"] = None, {}  # a spawned rank starts its own
        state["function_events"] = None
        return state


def _events(profiler: Any) -> Any:
    """The profiler's recorded events; ``None`` when a ``schedule`` never reached an active cycle."""
    try:
        return profiler.events()
    except AssertionError:  # torch: "Profiler must be initialized before accessing events"
        return None
