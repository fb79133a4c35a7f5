"""``RichModelSummary``: the model summary as a ``rich`` table (``pip install drivetrain[rich]``)."""

from __future__ import annotations

import logging
from typing import Any

from drivetrain._utilities.log import get_logger
from drivetrain.trainer.callbacks.model_summary import ModelSummary, SummaryData
from drivetrain.trainer.callbacks.rich_progress import require_rich

_log = get_logger("drivetrain.trainer.callbacks.model_summary")
_OPTIONS = ("header_style", "title", "title_style", "show_lines", "box")


class RichModelSummary(ModelSummary):
    """The summary of :class:`ModelSummary` (layers, parameter counts, sizes) drawn as a ``rich`` table.

    Printed by global rank 0 to standard output at the start of fit; silenced, like the plain
    summary, by raising the ``drivetrain`` logger's level above INFO. The Trainer uses it instead
    of the plain summary when a :class:`RichProgressBar` is among its callbacks.

    Args:
        max_depth: how deep into nested submodules the table goes (0: totals only; -1: every level).
        **summarize_kwargs: the table's look: ``header_style`` (default ``"bold magenta"``), ``title``,
            ``title_style``, ``show_lines``, ``box`` (as ``rich.table.Table`` takes them).

    Raises:
        ModuleNotFoundError: ``rich`` is not installed.

    Example:
        >>> from drivetrain.trainer.callbacks import RichModelSummary
        >>> trainer = Trainer(callbacks=[RichModelSummary(max_depth=2)])  # doctest: +SKIP
    """

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        require_rich("RichModelSummary")
        super().__init__(max_depth=max_depth)
        unknown = sorted(set(summarize_kwargs) - set(_OPTIONS))
        if unknown:
            raise ValueError(
                f"RichModelSummary got {', '.join(unknown)}; the table takes {', '.join(_OPTIONS)}."
            )
        self._table_options: dict[str, Any] = {"header_style": "bold magenta", **summarize_kwargs}
        #: The ``rich.console.Console`` it prints to (``None``: rich's standard-output console).
        self.console: Any = None

    def show(self, data: SummaryData) -> None:
        if not _log.isEnabledFor(logging.INFO):
            return
        from rich import get_console
        from rich.table import Table

        console = self.console if self.console is not None else get_console()
        table = Table(**self._table_options)
        table.add_column(data.header[0], justify="right", style="dim")  # the row number
        for name in data.header[1:]:
            table.add_column(name)
        for row in data.rows:
            table.add_row(*(str(cell) for cell in row))
        if data.rows:
            console.print(table)
        if data.input_output is not None:
            console.print(f"Input: {data.input_output[0]}  Output: {data.input_output[1]}")
        totals = Table.grid(padding=(0, 1))
        totals.add_column(justify="right", style="bold")
        totals.add_column()
        for value, label in data.totals:
            totals.add_row(value, label[0].upper() + label[1:])
        console.print(totals)
