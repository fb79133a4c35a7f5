# ruff: noqa: RUF001, RUF002 (tables and messages use typographic signs on purpose)
"""What a run produces: per-case results, the machine they were measured on, JSON and Markdown.

Cases fill in a :class:`CaseResult` (already formatted tables for people, plain data for the
JSON); this module adds the machine description and the list of targets, and writes both files.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.intervals import Decision, Interval, Measurement, Scale
from benchmarks.stats import Summary


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]


@dataclass
class CaseResult:
    name: str
    title: str
    description: str
    tables: list[Table] = field(default_factory=list)
    # Every number with its evidence; those with a limit are the targets.
    measurements: list[Measurement] = field(default_factory=list)
    # Fairness violations and failed variants: these make the run exit non-zero.
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # The machine's load before and after the case (benchmarks.load), and the warning if any.
    load: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None

    def measurement(self, key: str) -> Measurement | None:
        return next((m for m in self.measurements if m.key == key), None)

    def as_dict(self) -> dict[str, Any]:
        payload = asdict(self)
        payload["measurements"] = [m.as_dict() for m in self.measurements]
        return payload


# ---------------------------------------------------------------- formatting


def fmt_seconds(value: float | None) -> str:
    """A duration with a unit that keeps three significant digits readable."""
    if value is None:
        return "—"
    magnitude = abs(value)
    if magnitude >= 1:
        return f"{value:.2f} s"
    if magnitude >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.3g} µs"


def fmt_summary(summary: Summary | None, unit: str = "s") -> str:
    """``median (min–max)``; a single sample shows only its value."""
    if summary is None:
        return "—"
    if unit == "s":
        fmt = fmt_seconds
    elif unit == "MiB":

        def fmt(v: float | None) -> str:
            return "—" if v is None else f"{v:.0f} MiB"

    else:

        def fmt(v: float | None) -> str:
            return "—" if v is None else f"{v:.4g}{unit}"

    if summary.count == 1 or summary.low == summary.high:
        return fmt(summary.median)
    return f"{fmt(summary.median)} ({fmt(summary.low)}–{fmt(summary.high)})"


def fmt_ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}×"


def fmt_delta(value: float | None) -> str:
    if value is None:
        return "—"
    return ("+" if value >= 0 else "−") + fmt_seconds(abs(value))


def decision_mark(decision: Decision | None) -> str:
    if decision is None:
        return ""
    return "**missed**" if decision is Decision.MISSED else decision.value


def fmt_value(value: float | None, scale: Scale, unit: str, *, signed: bool = False) -> str:
    """One number of a measurement in its unit: ``1.021×``, ``+97.9 ms``, ``2.51 M``."""
    if value is None:
        return "—"
    if scale is Scale.RATIO or unit.startswith("×"):
        return f"{value:.3f}×"
    if unit == "s":
        return fmt_delta(value) if signed else fmt_seconds(value)
    if unit == "instructions":
        return f"{value / 1e6:.3f} M" if abs(value) >= 1e5 else f"{value:,.0f}"
    return f"{value:.4g} {unit}"


def fmt_interval(interval: Interval | None, scale: Scale, unit: str, *, signed: bool = False) -> str:
    """``estimate [low, high]`` (95 %); one round has no interval and says so."""
    if interval is None:
        return "—"
    estimate = fmt_value(interval.estimate, scale, unit, signed=signed)
    if interval.low is None or interval.high is None:
        return f"{estimate} (one round: no interval)"
    if scale is Scale.EXACT and interval.low == interval.high:
        return estimate
    low = fmt_value(interval.low, scale, unit, signed=signed)
    high = fmt_value(interval.high, scale, unit, signed=signed)
    return f"{estimate} [{low}, {high}]"


def fmt_measurement(measurement: Measurement | None, *, signed: bool = False) -> str:
    if measurement is None:
        return "—"
    return fmt_interval(measurement.interval, measurement.scale, measurement.unit, signed=signed)


def fmt_limit(measurement: Measurement) -> str:
    assert measurement.limit is not None
    if measurement.scale is Scale.RATIO:
        return f"≤ {measurement.limit:g}{measurement.unit}"
    return "≤ " + fmt_value(measurement.limit, measurement.scale, measurement.unit, signed=True)


# ---------------------------------------------------------------- machine


def describe_machine() -> dict[str, Any]:
    """CPU model, cores, memory, OS and the drivetrain commit: what a reader needs to compare runs."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "os": f"{platform.system()} {platform.release()}",
        "load_average_at_start": _load_average(),
        "drivetrain_commit": _git_commit(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _load_average() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + (" (with uncommitted changes)" if dirty else "")


# ---------------------------------------------------------------- rendering


def render_markdown(
    title: str, machine: dict[str, Any], results: Sequence[CaseResult], preamble: str | None = None
) -> str:
    """The report: machine, versions, how to read the numbers (``preamble`` replaces the default), targets, cases."""
    lines = [f"# {title}", "", _machine_line(machine), ""]
    versions = machine.get("interpreters", {})
    for name, info in versions.items():
        lines.append(f"- {name}: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    if versions:
        lines.append("")
    for name, info in machine.get("drivetrain_sources", {}).items():
        lines.append(
            f"- drivetrain tree `{name}`: {info.get('path')} ({info.get('commit') or 'not a git checkout'})"
        )
    if machine.get("drivetrain_sources"):
        lines.append("")
    lines += [
        preamble
        or "Times: medians over fresh processes with (min–max). Ratios and differences: 20 % trimmed means of "
        "the paired rounds with their 95 % bootstrap interval [low, high]; a target is met or missed only "
        "when its whole interval is on one side of the limit, undecided otherwise.",
        "",
    ]
    if any(r.warnings for r in results):
        lines += ["**Warnings:**", ""]
        lines += [f"- {w}" for r in results for w in r.warnings]
        lines.append("")
    targets = [m for r in results for m in r.measurements if m.limit is not None]
    if targets:
        lines += [
            "## Targets",
            "",
            "| target | limit | measured [95 % interval] | rounds | decision |",
            "|---|---|---|---|---|",
        ]
        for m in targets:
            units = m.interval.units if m.interval else 0
            lines.append(
                f"| {m.label} | {fmt_limit(m)} | {fmt_measurement(m, signed=m.unit == 's')} | {units} | "
                f"{decision_mark(m.decision)} |"
            )
        lines.append("")
    for result in results:
        lines += [f"## {result.title}", ""]
        if result.skipped:
            lines += [f"Skipped: {result.skipped}", ""]
            continue
        lines += [result.description, ""]
        if result.load:
            lines += [_load_line(result.load), ""]
        for table in result.tables:
            lines += render_table(table)
        if result.problems:
            lines += ["**Problems (the run fails because of these):**", ""]
            lines += [f"- {p.splitlines()[0]}" for p in result.problems]
            lines.append("")
        for note in result.notes:
            lines += [f"- {note}"]
        if result.notes:
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def render_table(table: Table) -> list[str]:
    lines = [f"**{table.title}**", ""] if table.title else []
    lines.append("| " + " | ".join(table.header) + " |")
    lines.append("|" + "---|" * len(table.header))
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in table.rows]
    lines.append("")
    return lines


def _load_line(load: dict[str, Any]) -> str:
    def one(reading: dict[str, Any] | None) -> str:
        if not reading or reading.get("runnable") is None:
            return "not readable"
        busy = "" if reading.get("busy") is None else f", CPU {reading['busy']:.0%} busy"
        mark = " (**busy**)" if reading.get("too_busy") else ""
        return f"{reading['runnable']:.1f} runnable tasks besides the suite{busy}{mark}"

    return f"Machine load before: {one(load.get('before'))}; after: {one(load.get('after'))}."


def _machine_line(machine: dict[str, Any]) -> str:
    parts = [
        f"Measured {machine.get('date', '?')} on {machine.get('cpu', '?')}",
        f"{machine.get('cores', '?')} cores",
        f"{machine.get('memory_gib', '?')} GiB RAM",
        machine.get("os", "?"),
    ]
    if machine.get("gpu"):
        parts.append(str(machine["gpu"]))
    if machine.get("load_average_at_start") is not None:
        parts.append("load average at start " + "/".join(map(str, machine["load_average_at_start"])))
    if machine.get("drivetrain_commit"):
        parts.append(f"drivetrain {machine['drivetrain_commit']}")
    return ", ".join(parts) + "."


def write_results(
    directory: Path,
    stem: str,
    title: str,
    machine: dict[str, Any],
    results: Sequence[CaseResult],
    preamble: str | None = None,
) -> tuple[Path, Path]:
    """Write ``<stem>.json`` and ``<stem>.md`` into ``directory``; returns both paths."""
    directory.mkdir(parents=True, exist_ok=True)
    json_path = directory / f"{stem}.json"
    md_path = directory / f"{stem}.md"
    payload = {"title": title, "machine": machine, "cases": [r.as_dict() for r in results]}
    json_path.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    md_path.write_text(render_markdown(title, machine, results, preamble))
    return json_path, md_path
