# ruff: noqa: RUF001 (the rendered tables use typographic signs on purpose)
"""Formatting and rendering of the results (Markdown table and JSON file)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.report import (
    CaseResult,
    Table,
    Target,
    fmt_delta,
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


def _result() -> CaseResult:
    return CaseResult(
        name="step_time",
        title="1. Step time",
        description="What is measured.",
        tables=[Table("tiny", ["variant", "step time"], [["raw", "1 ms"], ["a|b", "2 ms"]])],
        targets=[
            Target("Trainer", "≤ 1.05× raw", "1.100×", False),
            Target("Accelerator", "≤ 1.02× raw", "—", None),
        ],
        problems=["framework sample 0: final loss 0.6 differs\nmore detail"],
    )


def test_markdown_names_the_machine_and_renders_targets_tables_and_problems() -> None:
    text = render_markdown(
        "Benchmarks", MACHINE, [_result(), CaseResult("gpu", "5. GPU", "", skipped="no CUDA")]
    )
    assert "Test CPU 9000, 2 cores, 24.0 GiB RAM" in text
    assert "| Trainer | ≤ 1.05× raw | 1.100× | **missed** |" in text
    assert "| Accelerator | ≤ 1.02× raw | — | not measured |" in text
    assert "| variant | step time |\n|---|---|\n| raw | 1 ms |\n| a\\|b | 2 ms |" in text
    assert "- framework sample 0: final loss 0.6 differs\n" in text
    assert "Skipped: no CUDA" in text


def test_write_results_writes_parseable_json_and_the_table(tmp_path: Path) -> None:
    json_path, md_path = write_results(tmp_path / "out", "latest", "Benchmarks", MACHINE, [_result()])
    payload = json.loads(json_path.read_text())
    assert payload["machine"]["cpu"] == "Test CPU 9000"
    assert payload["cases"][0]["targets"][0]["met"] is False
    assert md_path.read_text().startswith("# Benchmarks\n")
