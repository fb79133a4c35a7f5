# ruff: noqa: RUF001 (the rendered tables use typographic signs on purpose)
"""Formatting and rendering of the results (Markdown table and JSON file)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from benchmarks.intervals import Interval, Measurement, Scale
from benchmarks.report import (
    CaseResult,
    Table,
    fmt_delta,
    fmt_interval,
    fmt_ratio,
    fmt_seconds,
    fmt_summary,
    render_markdown,
    write_results,
)
from benchmarks.stats import Summary

MACHINE = {
    "cpu": "Test CPU 9000",
    "cores": 2,
    "memory_gib": 24.0,
    "os": "Linux",
    "date": "2026-01-01 00:00 UTC",
}


def test_seconds_are_shown_in_a_readable_unit() -> None:
    assert fmt_seconds(2.5) == "2.50 s"
    assert fmt_seconds(0.0123) == "12.3 ms"
    assert fmt_seconds(0.000412) == "412 µs"
    assert fmt_seconds(None) == "—"


def test_summary_shows_median_and_range_unless_there_is_one_value() -> None:
    assert fmt_summary(Summary(0.002, 0.001, 0.003, 3)) == "2 ms (1 ms–3 ms)"
    assert fmt_summary(Summary(0.002, 0.002, 0.002, 1)) == "2 ms"
    assert fmt_summary(Summary(300.4, 290.0, 310.0, 2), "MiB") == "300 MiB (290 MiB–310 MiB)"


def test_ratio_and_delta_formatting() -> None:
    assert fmt_ratio(1.0412) == "1.041×"
    assert fmt_delta(0.05) == "+50 ms"
    assert fmt_delta(-0.5) == "−500 ms"


def test_intervals_are_shown_with_their_estimate_in_the_unit() -> None:
    assert (
        fmt_interval(Interval(1.0213, 1.0121, 1.0304, 40), Scale.RATIO, "× raw") == "1.021× [1.012×, 1.030×]"
    )
    assert (
        fmt_interval(Interval(0.0979, 0.0974, 0.0983, 5), Scale.LINEAR, "s") == "97.9 ms [97.4 ms, 98.3 ms]"
    )
    assert (
        fmt_interval(Interval(-0.151, -0.2, 0.05, 3), Scale.LINEAR, "s", signed=True)
        == "−151 ms [−200 ms, +50 ms]"
    )
    assert (
        fmt_interval(Interval(1.04, None, None, 1), Scale.RATIO, "× raw") == "1.040× (one round: no interval)"
    )
    assert fmt_interval(Interval(2.5e6, 2.5e6, 2.5e6, 2), Scale.EXACT, "instructions") == "2.500 M"
    assert fmt_interval(None, Scale.RATIO, "× raw") == "—"


def _ratios(center: float) -> list[list[float]]:
    return [[math.log(center) + 0.001 * ((i % 7) - 3)] for i in range(30)]


def _result() -> CaseResult:
    return CaseResult(
        name="step_time",
        title="1. Step time",
        description="What is measured.",
        tables=[Table("tiny", ["variant", "step time"], [["raw", "1 ms"], ["a|b", "2 ms"]])],
        measurements=[
            Measurement("a", "Trainer", Scale.RATIO, "× raw", _ratios(1.10), limit=1.05),
            Measurement("b", "Accelerator", Scale.RATIO, "× raw", [], limit=1.02),
            Measurement("c", "Fabric", Scale.RATIO, "× raw", _ratios(1.01), limit=1.02),
            Measurement("d", "Peer", Scale.RATIO, "× raw", _ratios(1.5)),
        ],
        problems=["framework sample 0: final loss 0.6 differs\nmore detail"],
        load={
            "before": {"runnable": 0.2, "busy": 0.05, "too_busy": False},
            "after": {"runnable": 3.5, "busy": 1.0, "too_busy": True},
        },
        warnings=["machine busy after step_time"],
    )


def test_markdown_names_the_machine_and_renders_targets_tables_and_problems() -> None:
    text = render_markdown(
        "Benchmarks", MACHINE, [_result(), CaseResult("gpu", "5. GPU", "", skipped="no CUDA")]
    )
    assert "Test CPU 9000, 2 cores, 24.0 GiB RAM" in text
    assert "| Trainer | ≤ 1.05× raw | 1.100× [1.099×, 1.101×] | 30 | **missed** |" in text
    assert "| Accelerator | ≤ 1.02× raw | — | 0 | not measured |" in text
    assert "| Fabric | ≤ 1.02× raw | 1.010× [1.009×, 1.011×] | 30 | met |" in text
    assert "Peer" not in text.split("## Targets")[1].split("## 1.")[0]  # no limit, no target row
    assert "| variant | step time |\n|---|---|\n| raw | 1 ms |\n| a\\|b | 2 ms |" in text
    assert "- framework sample 0: final loss 0.6 differs\n" in text
    assert "Machine load before: 0.2 runnable tasks besides the suite, CPU 5% busy; after: 3.5" in text
    assert "**Warnings:**\n\n- machine busy after step_time" in text
    assert "Skipped: no CUDA" in text


def test_write_results_writes_parseable_json_and_the_table(tmp_path: Path) -> None:
    json_path, md_path = write_results(tmp_path / "out", "latest", "Benchmarks", MACHINE, [_result()])
    payload = json.loads(json_path.read_text())
    assert payload["machine"]["cpu"] == "Test CPU 9000"
    measurements = payload["cases"][0]["measurements"]
    assert [m["decision"] for m in measurements] == ["missed", "not measured", "met", None]
    assert measurements[0]["groups"] == _ratios(1.10)  # the rounds travel, for --compare
    assert md_path.read_text().startswith("# Benchmarks\n")
