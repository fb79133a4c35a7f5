"""``RichProgressBar``: the progress bars drawn with the ``rich`` library (``pip install drivetrain[rich]``).

``rich`` is imported when the first bar opens, not when this module is. The bars redraw at most
every ``refresh_interval`` seconds (or every ``refresh_rate`` batches), like the tqdm bars, so
a fast step pays a counter increment and a clock read. Output that is not a terminal gets plain
lines (see :mod:`~drivetrain.trainer.callbacks.plain_progress`).
"""

from __future__ import annotations

import importlib.util
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from drivetrain.trainer.callbacks.plain_progress import PlainProgress, clock
from drivetrain.trainer.callbacks.progress import StageBars

if TYPE_CHECKING:
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer


def require_rich(what: str) -> None:
    """A clear error when ``rich`` is missing (naming the extra to install)."""
    if importlib.util.find_spec("rich") is None:
        raise ModuleNotFoundError(
            f"{what} draws with the rich library, which is not installed. Install it with "
            f"`pip install 'drivetrain[rich]'` (or `pip install rich`), or use the tqdm/plain variant."
        )


@dataclass
class RichProgressBarTheme:
    """The styles of :class:`RichProgressBar` (any ``rich`` style: ``"bold red"``, ``"#6206E0"`` …).

    ``metrics_format`` formats float metrics; ``metrics_text_delimiter`` separates them.
    """

    description: Any = ""
    progress_bar: Any = "#6206E0"
    progress_bar_finished: Any = "#6206E0"
    progress_bar_pulse: Any = "#6206E0"
    batch_progress: Any = ""
    time: Any = "dim"
    processing_speed: Any = "dim underline"
    metrics: Any = "italic"
    metrics_text_delimiter: str = " "
    metrics_format: str = ".3f"


class RichProgressBar(StageBars):
    """Bars for training epochs, validation, test and predict, drawn with ``rich`` on global rank 0.

    Each bar shows the batches done, the elapsed and remaining time, the speed in it/s and (for
    training) the ``prog_bar`` metrics. Validation bars disappear when validation ends; the
    last epoch's bar stays.

    Args:
        refresh_rate: redraw every this many batches, as in Lightning (``0`` turns the bars off).
            Unset, the bars redraw by time (``refresh_interval``), which costs less on fast steps.
        leave: keep each epoch's bar on screen when the next epoch begins (Lightning's default: no).
        theme: the styles (a :class:`RichProgressBarTheme`).
        console_kwargs: arguments for the ``rich.console.Console`` the bars draw on (default: standard
            output), such as ``{"force_terminal": True}`` or ``{"file": stream}``.
        refresh_interval: the least time in seconds between two redraws (when ``refresh_rate`` is unset).
        log_interval: when the console is not a terminal (a log file), the least time in seconds between
            two progress lines; each epoch and evaluation also gets a line when it ends.

    Raises:
        ModuleNotFoundError: ``rich`` is not installed.

    Example:
        >>> from drivetrain.trainer.callbacks import RichProgressBar, RichProgressBarTheme
        >>> bar = RichProgressBar(theme=RichProgressBarTheme(metrics="green"))
        >>> trainer = Trainer(callbacks=[bar])  # doctest: +SKIP
    """

    summary_style = "rich"

    def __init__(
        self,
        refresh_rate: int | None = None,
        leave: bool = False,
        theme: RichProgressBarTheme | None = None,
        console_kwargs: dict[str, Any] | None = None,
        *,
        refresh_interval: float | None = None,
        log_interval: float = 30.0,
    ) -> None:
        require_rich("RichProgressBar")
        super().__init__(refresh_rate, leave, refresh_interval, log_interval)
        if theme is not None and not isinstance(theme, RichProgressBarTheme):
            raise TypeError(f"RichProgressBar(theme={theme!r}); pass a RichProgressBarTheme.")
        if console_kwargs is not None and not isinstance(console_kwargs, dict):
            raise TypeError(
                f"RichProgressBar(console_kwargs={console_kwargs!r}); pass a dict of rich.console.Console arguments."
            )
        self.theme = theme if theme is not None else RichProgressBarTheme()
        self._console_kwargs = dict(console_kwargs or {})
        self._console: Any = None
        self._progress: Any = None  # the rich Progress (a live display) while bars are on screen
        self._last_train: _RichBar | None = None

    @property
    def console(self) -> Any:
        """The ``rich.console.Console`` the bars draw on (made on first use)."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._console_kwargs)
        return self._console

    @property
    def progress(self) -> Any:
        """The ``rich.progress.Progress`` on screen, or ``None``."""
        return self._progress

    def _bar(self, description: str, total: float, *, training: bool, transient: bool = False) -> Any:
        console = self.console
        if not (console.is_terminal or console.is_jupyter):  # a notebook draws rich's live display itself
            return PlainProgress(description, total, _line_writer(console), self.log_interval)
        if self._progress is None:
            self._progress = _start_progress(console, self.theme)
        if training and self._last_train is not None and not self.leave:
            self._last_train.hide()  # one epoch bar at a time, as in Lightning
        bar = _RichBar(
            self._progress,
            description,
            total,
            self.theme,
            interval=self.refresh_interval,
            every=self.refresh_rate or 0,
            transient=transient,
        )
        if training:
            self._last_train = bar
        return bar

    def teardown(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        if self._progress is not None:
            self._progress.stop()  # what is on screen stays; the terminal gets its cursor back
        # Nothing of rich travels with a pickled Trainer (ddp_spawn).
        self._progress = self._console = self._last_train = None


class _RichBar:
    """One task of the shared ``Progress``, redrawn when due (the same throttle as the tqdm bars)."""

    def __init__(
        self,
        progress: Any,
        description: str,
        total: float,
        theme: RichProgressBarTheme,
        *,
        interval: float,
        every: int,
        transient: bool,
    ) -> None:
        self.progress = progress
        self.theme = theme
        self.sized = bool(total) and not math.isinf(total)
        self.total = int(total) if self.sized else None
        self.task = progress.add_task(
            description, total=self.total, times="", rate="", metrics="", count=self._count(0)
        )
        self.done = 0
        self.pending = 0
        self.interval = interval
        self.every = every
        self.transient = transient
        self.start = time.monotonic()
        self.next_draw = 0.0
        self.metrics = ""

    def _count(self, done: int) -> str:
        return f"{done}/{self.total}" if self.total is not None else f"{done}"

    def advance(self, postfix: Any = None) -> None:
        self.pending += 1
        if self.every:  # a batch count (Lightning's refresh_rate) instead of a time
            if self.pending >= self.every:
                self.draw(postfix)
            return
        now = time.monotonic()
        if now >= self.next_draw:
            self.draw(postfix, now)

    def draw(self, postfix: Any = None, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.done += self.pending
        self.pending = 0
        self.next_draw = now + self.interval
        if postfix is not None:
            metrics = postfix() if callable(postfix) else postfix
            if metrics:
                self.metrics = _metrics_text(metrics, self.theme)
        elapsed = now - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        times = clock(elapsed)
        if self.total is not None:
            times += f" • {clock((self.total - self.done) / rate) if rate > 0 else '-:--:--'}"
        self.progress.update(
            self.task,
            completed=self.done,
            count=self._count(self.done),
            times=times,
            rate=f"{rate:.2f}it/s",
            metrics=self.metrics,
        )
        self.progress.refresh()

    def close(self, postfix: Any = None) -> None:
        self.draw(postfix)
        if self.transient:
            self.hide()

    def hide(self) -> None:
        """Take the bar off the screen for good (removed, so a long fit keeps no hidden tasks)."""
        if self.task in self.progress.task_ids:
            self.progress.remove_task(self.task)
            self.progress.refresh()

    def discard(self) -> None:
        """Nothing to release: the shared display stops with the bar callback."""


def _metrics_text(metrics: dict[str, Any], theme: RichProgressBarTheme) -> str:
    parts = []
    for name, value in metrics.items():
        shown = format(value, theme.metrics_format) if isinstance(value, float) else str(value)
        parts.append(f"{name}: {shown}")
    return theme.metrics_text_delimiter.join(parts)


def _start_progress(console: Any, theme: RichProgressBarTheme) -> Any:
    from rich.progress import BarColumn, Progress, TextColumn

    def style(value: Any) -> Any:
        return value if value else "none"

    columns = [
        TextColumn("{task.description}", style=style(theme.description)),
        BarColumn(
            complete_style=style(theme.progress_bar),
            finished_style=style(theme.progress_bar_finished),
            pulse_style=style(theme.progress_bar_pulse),
        ),
        TextColumn("{task.fields[count]}", style=style(theme.batch_progress)),
        TextColumn("{task.fields[times]}", style=style(theme.time)),
        TextColumn("{task.fields[rate]}", style=style(theme.processing_speed)),
        TextColumn("{task.fields[metrics]}", style=style(theme.metrics)),
    ]
    # Redrawn by the bars only (no refresh thread): the cost stays with the batches that redraw.
    progress = Progress(*columns, console=console, auto_refresh=False)
    progress.start()
    return progress


def _line_writer(console: Any) -> Any:
    def write(text: str) -> None:
        stream = console.file
        stream.write(text)
        stream.flush()

    return write
