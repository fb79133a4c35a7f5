# ruff: noqa: RUF001, RUF002 (tables use typographic signs on purpose)
"""Before/after tables: how each measurement changed between two runs, or two trees of one run.

``python -m benchmarks --compare OLD.json NEW.json`` matches the measurements of two result files
by key (case / table / variant / metric) and prints, per case, the old and new values with their
intervals and the change with its own 95 % interval: for a ratio to raw, ``new / old`` (each run
resampled on its own, so the interval carries the noise of both); for a time in seconds,
``new − old``; for instruction counts, the plain quotient (they have no sampling noise). A change
whose interval excludes "no change" is reported as lower or higher; otherwise "no clear change".

A run with several ``--drivetrain-src`` trees gets the same table inside its own report, each
tree against the first one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.intervals import Interval, Measurement, Scale, bootstrap_change
from benchmarks.report import Table, decision_mark, fmt_interval, fmt_measurement, render_table


class CompareError(ValueError):
    """A results file that cannot be compared (missing, not JSON, or without measurements)."""


@dataclass(frozen=True)
class Change:
    """How one measurement moved from ``old`` to ``new``."""

    old: Measurement
    new: Measurement
    interval: Interval | None

    @property
    def verdict(self) -> str:
        if self.interval is None:
            return "not comparable"
        if self.interval.low is None or self.interval.high is None:
            return "too few rounds"
        neutral = 0.0 if self.old.scale is Scale.LINEAR else 1.0
        if self.interval.high < neutral:
            return "lower"
        if self.interval.low > neutral:
            return "higher"
        return "no clear change"

    def describe(self) -> str:
        if self.interval is None:
            return "—"
        if self.old.scale is Scale.LINEAR:
            return fmt_interval(self.interval, Scale.LINEAR, self.old.unit, signed=True)
        return fmt_interval(self.interval, self.old.scale, "× old")


def change(old: Measurement, new: Measurement) -> Change:
    """The change from ``old`` to ``new`` (same key, same scale) with its interval."""
    if old.scale is not new.scale or old.unit != new.unit:
        return Change(old, new, None)
    if not any(old.groups) or not any(new.groups):
        return Change(old, new, None)
    if old.scale is Scale.EXACT:
        before, after = old.interval, new.interval
        assert before is not None and after is not None
        if before.estimate == 0 or not before.low or not before.high:
            return Change(old, new, None)
        assert after.low is not None and after.high is not None
        interval = Interval(
            after.estimate / before.estimate,
            after.low / before.high,
            after.high / before.low,
            min(before.units, after.units),
        )
        return Change(old, new, interval)
    interval = bootstrap_change(old.groups, new.groups)
    if old.scale is Scale.RATIO:
        interval = interval.map(math.exp)
    return Change(old, new, interval)


def load_measurements(path: Path) -> dict[str, tuple[str, Measurement]]:
    """key -> (case title, measurement) from a results file written by ``python -m benchmarks run``."""
    try:
        payload = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CompareError(
            f"{path}: no such file (give the .json a run wrote, e.g. benchmarks/results/latest.json)"
        ) from None
    except (OSError, json.JSONDecodeError) as error:
        raise CompareError(f"{path}: not a readable JSON results file ({error})") from None
    found: dict[str, tuple[str, Measurement]] = {}
    for case in payload.get("cases", []) if isinstance(payload, dict) else []:
        for item in case.get("measurements", []):
            found[item["key"]] = (case.get("title", case.get("name", "?")), Measurement.from_dict(item))
    if not found:
        raise CompareError(
            f"{path}: holds no measurements with their rounds (written before the suite kept them, or not a "
            f"results file); run `python -m benchmarks run` to produce one"
        )
    return found


def changes_between(
    old: dict[str, tuple[str, Measurement]], new: dict[str, tuple[str, Measurement]]
) -> list[tuple[str, Change]]:
    """(case title, change) for every key present in both, in the new file's order."""
    return [
        (title, change(old[key][1], measurement)) for key, (title, measurement) in new.items() if key in old
    ]


def source_changes(measurements: Iterable[Measurement], baseline: str, other: str) -> list[Change]:
    """Tree ``other``'s measurements against tree ``baseline``'s (keys differing only in ``@tree``)."""
    by_key = {m.key: m for m in measurements}
    marker = f"@{other}/"
    found = []
    for key, measurement in by_key.items():
        if marker in key:
            old = by_key.get(key.replace(marker, f"@{baseline}/"))
            if old is not None:
                found.append(change(old, measurement))
    return found


def changes_table(
    title: str, changes: Sequence[Change], old_name: str = "old", new_name: str = "new", *, drop: str = ""
) -> Table:
    """One row per change; ``drop`` is removed from the labels (a tree's ``[name]``, say)."""
    rows = []
    for item in changes:
        decisions = ""
        if item.old.limit is not None or item.new.limit is not None:
            # A target that moved to another measurement (or a new one) shows as "no target" on one side.
            decisions = f"{_decision(item.old)} → {_decision(item.new)}"
        signed = item.new.unit == "s"
        rows.append(
            [
                item.new.label.replace(drop, "") if drop else item.new.label,
                fmt_measurement(item.old, signed=signed),
                fmt_measurement(item.new, signed=signed),
                item.describe(),
                item.verdict,
                decisions,
            ]
        )
    header = ["measurement", old_name, new_name, "change [95 %]", "verdict", "target decision"]
    return Table(title, header, rows)


def render_comparison(old_path: Path, new_path: Path) -> str:
    """The Markdown ``--compare`` prints."""
    old, new = load_measurements(old_path), load_measurements(new_path)
    lines = [f"# Benchmark comparison: {old_path} → {new_path}", ""]
    lines += [_run_line("old", old_path), _run_line("new", new_path), ""]
    by_case: dict[str, list[Change]] = {}
    for title, item in changes_between(old, new):
        by_case.setdefault(title, []).append(item)
    for title, items in by_case.items():
        lines += render_table(changes_table(title, items))
    # Cases change layout between versions of the suite (a target decided by another measurement,
    # a table added): what only one side has is listed, with its value and target, not dropped.
    only_old = [key for key in old if key not in new]
    only_new = [key for key in new if key not in old]
    if only_new:
        lines += render_table(_one_side_table(f"New measurements (only in {new_path})", new, only_new))
    if only_old:
        lines += render_table(_one_side_table(f"Removed measurements (only in {old_path})", old, only_old))
    if not by_case:
        lines += ["No measurement appears in both files.", ""]
    return "\n".join(lines).rstrip() + "\n"


def _decision(measurement: Measurement) -> str:
    return "no target" if measurement.limit is None else decision_mark(measurement.decision)


def _one_side_table(title: str, found: dict[str, tuple[str, Measurement]], keys: Sequence[str]) -> Table:
    rows = []
    for key in keys:
        case, measurement = found[key]
        target = (
            f"{_decision(measurement)} (limit {measurement.limit:g})" if measurement.limit is not None else ""
        )
        rows.append(
            [case, measurement.label, fmt_measurement(measurement, signed=measurement.unit == "s"), target]
        )
    return Table(title, ["case", "measurement", "value [95 %]", "target decision"], rows)


def _run_line(name: str, path: Path) -> str:
    machine: dict[str, Any] = json.loads(Path(path).read_text()).get("machine", {})
    parts = [
        machine.get("date", "?"),
        machine.get("cpu", "?"),
        f"drivetrain {machine.get('drivetrain_commit', '?')}",
    ]
    return f"- {name}: " + ", ".join(str(p) for p in parts)
