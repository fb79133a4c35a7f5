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

from benchmarks.stats import Summary


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]


@dataclass
class Target:
    """A performance goal and what this run measured against it (a miss is a finding, not a failure)."""

    what: str
    limit: str
    measured: str
    met: bool | None  # None: not measured (a variant failed or was not run)


@dataclass
class CaseResult:
    name: str
    title: str
    description: str
    tables: list[Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    # Fairness violations and failed variants: these make the run exit non-zero.
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None


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


def target_mark(met: bool | None) -> str:
    return {True: "met", False: "**missed**", None: "not measured"}[met]


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


def render_markdown(title: str, machine: dict[str, Any], results: Sequence[CaseResult]) -> str:
    lines = [f"# {title}", "", _machine_line(machine), ""]
    versions = machine.get("interpreters", {})
    for name, info in versions.items():
        lines.append(f"- {name}: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    if versions:
        lines.append("")
    lines += ["Times are medians over fresh processes, with (min–max); ratios are median over median.", ""]
    targets = [(r, t) for r in results for t in r.targets]
    if targets:
        lines += ["## Targets", "", "| target | limit | measured | |", "|---|---|---|---|"]
        lines += [f"| {t.what} | {t.limit} | {t.measured} | {target_mark(t.met)} |" for _, t in targets]
        lines.append("")
    for result in results:
        lines += [f"## {result.title}", ""]
        if result.skipped:
            lines += [f"Skipped: {result.skipped}", ""]
            continue
        lines += [result.description, ""]
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
    directory: Path, stem: str, title: str, machine: dict[str, Any], results: Sequence[CaseResult]
) -> tuple[Path, Path]:
    """Write ``<stem>.json`` and ``<stem>.md`` into ``directory``; returns both paths."""
    directory.mkdir(parents=True, exist_ok=True)
    json_path = directory / f"{stem}.json"
    md_path = directory / f"{stem}.md"
    payload = {"title": title, "machine": machine, "cases": [asdict(r) for r in results]}
    json_path.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    md_path.write_text(render_markdown(title, machine, results))
    return json_path, md_path
