"""What the conformance kit found: one row per check, and the table it prints.

Each :class:`CheckResult` is passed, failed (with what went wrong and what to implement) or not
applicable (with why). A :class:`Report` holds the rows of one plugin; ``print(report)`` shows the
table, :meth:`Report.raise_for_failures` turns failures into one exception for a test.
"""

from __future__ import annotations

import enum
import textwrap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field


class Status(str, enum.Enum):
    """How a check ended."""

    PASSED = "passed"
    FAILED = "failed"
    NOT_APPLICABLE = "not applicable"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class CheckResult:
    """One row of a report.

    Attributes:
        name: what was checked, e.g. ``"accelerator: get_parallel_devices"`` or ``"Trainer, 2 processes:
            save, kill, resume"``.
        status: passed, failed or not applicable.
        reason: for a failure, what went wrong; for not applicable, why the check does not apply;
            for a pass, optionally what was seen.
        fix: for a failure, what to implement or change.
    """

    name: str
    status: Status
    reason: str = ""
    fix: str = ""

    @property
    def passed(self) -> bool:
        return self.status is Status.PASSED

    @property
    def failed(self) -> bool:
        return self.status is Status.FAILED

    def __str__(self) -> str:
        text = f"{self.status}: {self.name}"
        if self.reason:
            text += f" - {self.reason}"
        if self.fix:
            text += f" Fix: {self.fix}"
        return text


def passed(name: str, reason: str = "") -> CheckResult:
    """A passed row."""
    return CheckResult(name, Status.PASSED, reason)


def failed(name: str, reason: str, fix: str) -> CheckResult:
    """A failed row: what went wrong and what to implement."""
    return CheckResult(name, Status.FAILED, reason, fix)


def not_applicable(name: str, why: str) -> CheckResult:
    """A row that does not apply to this plugin, and why."""
    return CheckResult(name, Status.NOT_APPLICABLE, why)


class PluginCheckError(AssertionError):
    """A plugin failed checks of the conformance kit; the message lists each failure with its fix."""


@dataclass
class Report:
    """The rows the kit produced for one plugin.

    Attributes:
        plugin: what was checked (``"XPUAccelerator (xpu)"``).
        kind: ``"accelerator"``, ``"strategy"``, ``"precision"``, ``"checkpoint_io"`` or
            ``"cluster_environment"``.
        rows: the checks, in the order they ran.
        notes: how the checks ran (faked hardware, which programs were left out and why).
    """

    plugin: str
    kind: str
    rows: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, rows: CheckResult | Iterable[CheckResult]) -> None:
        """Append one row or several."""
        self.rows.extend([rows] if isinstance(rows, CheckResult) else rows)

    def __iter__(self) -> Iterator[CheckResult]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def failures(self) -> list[CheckResult]:
        return [row for row in self.rows if row.failed]

    @property
    def ok(self) -> bool:
        """Whether every row passed or does not apply."""
        return not self.failures

    def row(self, name: str) -> CheckResult:
        """The row called ``name`` (``KeyError`` listing the names when there is none)."""
        for row in self.rows:
            if row.name == name:
                return row
        raise KeyError(f"No row {name!r} in the report of {self.plugin}; rows: {[r.name for r in self.rows]}")

    def raise_for_failures(self) -> None:
        """Raise :class:`PluginCheckError` listing every failed row (its reason and fix), if any failed."""
        if self.ok:
            return
        lines = [f"{self.plugin} failed {len(self.failures)} of {len(self.rows)} checks:"]
        lines += [f"- {row.name}: {row.reason} Fix: {row.fix}" for row in self.failures]
        raise PluginCheckError("\n".join(lines))

    def table(self, width: int = 110) -> str:
        """The report as a text table: one line per check, reasons and fixes wrapped below it."""
        counts = {status: sum(row.status is status for row in self.rows) for status in Status}
        title = (
            f"drivetrain plugin check: {self.plugin} ({self.kind}): {counts[Status.PASSED]} passed, "
            f"{counts[Status.FAILED]} failed, {counts[Status.NOT_APPLICABLE]} not applicable"
        )
        name_width = min(max([len(row.name) for row in self.rows] + [5]), 74)
        lines = [title, "=" * min(len(title), width)]
        lines.append(f"{'check'.ljust(name_width)}  result")
        lines.append(f"{'-' * name_width}  {'-' * 14}")
        indent = " " * (name_width + 2)
        for row in self.rows:
            name = row.name if len(row.name) <= name_width else row.name[: name_width - 1] + "…"
            lines.append(f"{name.ljust(name_width)}  {row.status}")
            detail = row.reason
            if row.fix:
                detail = f"{detail} Fix: {row.fix}" if detail else f"Fix: {row.fix}"
            if detail:
                lines += textwrap.wrap(
                    detail, width=max(width, name_width + 30), initial_indent=indent, subsequent_indent=indent
                )
        for note in self.notes:
            lines += textwrap.wrap(f"note: {note}", width=width)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()
