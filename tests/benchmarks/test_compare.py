# ruff: noqa: RUF001 (the rendered tables use typographic signs on purpose)
"""``--compare OLD.json NEW.json`` and the trees-compared table: changes with their intervals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from benchmarks.__main__ import main
from benchmarks.compare import (
    CompareError,
    change,
    changes_table,
    load_measurements,
    render_comparison,
    source_changes,
)
from benchmarks.intervals import Measurement, Scale
from benchmarks.report import CaseResult, write_results

MACHINE = {"cpu": "Test CPU", "cores": 2, "date": "2026-01-01 00:00 UTC", "drivetrain_commit": "abc1234"}


def _ratio(key: str, center: float, spread: float = 0.004, *, limit: float | None = None) -> Measurement:
    values = [[math.log(center) + spread * ((i * 7 % 11) - 5) / 5] for i in range(40)]
    return Measurement(key, key.split("/")[2], Scale.RATIO, "× raw", values, limit)


def test_a_ratio_that_moved_more_than_its_noise_is_lower_or_higher() -> None:
    faster = change(_ratio("s/t/x/step_s", 1.10), _ratio("s/t/x/step_s", 1.02))
    assert faster.interval.estimate == pytest.approx(1.02 / 1.10, rel=1e-3)
    assert faster.verdict == "lower"
    assert faster.describe().startswith("0.927× [")
    slower = change(_ratio("s/t/x/step_s", 1.02), _ratio("s/t/x/step_s", 1.10))
    assert slower.verdict == "higher"
    same = change(_ratio("s/t/x/step_s", 1.05, 0.05), _ratio("s/t/x/step_s", 1.051, 0.05))
    assert same.verdict == "no clear change"


def test_times_change_by_a_difference_and_counts_by_a_quotient() -> None:
    old = Measurement(
        "i/x/import_s", "import", Scale.LINEAR, "s", [[0.098 + 0.001 * (i % 3)] for i in range(5)]
    )
    new = Measurement(
        "i/x/import_s", "import", Scale.LINEAR, "s", [[0.048 + 0.001 * (i % 3)] for i in range(5)]
    )
    moved = change(old, new)
    assert moved.interval.estimate == pytest.approx(-0.05)
    assert moved.verdict == "lower"
    assert moved.describe().startswith("−50 ms [")
    counts = change(
        Measurement("c/x/per_step", "c", Scale.EXACT, "instructions", [[2_000_000.0, 2_000_000.0]]),
        Measurement("c/x/per_step", "c", Scale.EXACT, "instructions", [[1_900_000.0, 1_900_000.0]]),
    )
    assert counts.interval.estimate == pytest.approx(0.95)
    assert counts.verdict == "lower"
    assert counts.describe() == "0.950×"


def test_one_round_on_either_side_is_too_few() -> None:
    one = Measurement("g/x/y/step_s", "y", Scale.RATIO, "× raw", [[0.01]])
    assert change(one, one).verdict == "too few rounds"


def _write(directory: Path, name: str, measurements: list[Measurement]) -> Path:
    result = CaseResult("step_time", "1. Step time", "", measurements=measurements)
    json_path, _ = write_results(directory, name, "drivetrain benchmarks", MACHINE, [result])
    return json_path


def test_compare_prints_a_table_per_case_and_what_only_one_run_has(tmp_path: Path) -> None:
    old = _write(
        tmp_path,
        "old",
        [_ratio("step_time/tiny/acc/step_s", 1.08, limit=1.02), _ratio("step_time/tiny/gone/step_s", 2.0)],
    )
    new = _write(
        tmp_path,
        "new",
        [_ratio("step_time/tiny/acc/step_s", 1.01, limit=1.02), _ratio("step_time/tiny/added/step_s", 1.5)],
    )
    text = render_comparison(old, new)
    assert "| measurement | old | new | change [95 %] | verdict | target decision |" in text
    row = next(line for line in text.splitlines() if line.startswith("| acc |"))
    assert "| 1.080× [" in row and "| 1.010× [" in row and "| lower | **missed** → met |" in row
    assert f"**New measurements (only in {new})**" in text
    assert f"**Removed measurements (only in {old})**" in text
    new_part = text.split("**New measurements")[1].split("**Removed measurements")[0]
    removed_part = text.split("**Removed measurements")[1]
    assert "| 1. Step time | added | 1.500× [" in new_part and "gone" not in new_part
    assert "| 1. Step time | gone | 2.000× [" in removed_part and "added" not in removed_part


def test_compare_across_a_changed_case_layout_shows_where_each_target_went(tmp_path: Path) -> None:
    # The suite moved the wide-MLP target from the fresh-process case to the in-process A/B: the
    # old key stays comparable (now without a target), the new key is listed with its decision.
    old = _write(tmp_path, "old", [_ratio("step_time/wide/acc/step_s", 0.98, 0.05, limit=1.005)])
    new = _write(
        tmp_path,
        "new",
        [
            _ratio("step_time/wide/acc/step_s", 0.99, 0.05),
            _ratio("ab/wide/acc/cpu", 1.001, 0.001, limit=1.005),
        ],
    )
    text = render_comparison(old, new)
    row = next(line for line in text.splitlines() if line.startswith("| acc |"))
    assert row.endswith("| met → no target |")
    new_part = text.split("**New measurements")[1]
    assert "| 1. Step time | acc | 1.001× [" in new_part and "| met (limit 1.005) |" in new_part
    assert "Removed measurements" not in text


def test_the_command_line_compare_prints_and_rejects_files_it_cannot_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = _write(tmp_path, "old", [_ratio("step_time/tiny/acc/step_s", 1.08)])
    new = _write(tmp_path, "new", [_ratio("step_time/tiny/acc/step_s", 1.01)])
    assert main(["--compare", str(old), str(new)]) == 0
    assert "| acc |" in capsys.readouterr().out
    legacy = tmp_path / "legacy.json"
    legacy.write_text(json.dumps({"cases": [{"name": "step_time", "targets": []}]}))
    with pytest.raises(SystemExit) as exit_info:
        main(["--compare", str(legacy), str(new)])
    assert exit_info.value.code == 2
    assert "holds no measurements with their rounds" in capsys.readouterr().err
    with pytest.raises(CompareError, match="no such file"):
        load_measurements(tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(CompareError, match="not a readable JSON results file"):
        load_measurements(tmp_path / "broken.json")


def test_compare_and_run_do_not_mix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--compare", "a.json", "b.json", "run"])
    assert "runs nothing" in capsys.readouterr().err


def test_trees_of_one_run_are_compared_with_the_first() -> None:
    measurements = [
        _ratio("step_time/tiny/drivetrain_trainer@before/step_s", 1.08),
        _ratio("step_time/tiny/drivetrain_trainer@after/step_s", 1.01),
        _ratio("step_time/tiny/lightning_trainer/step_s", 2.0),
    ]
    changes = source_changes(measurements, "before", "after")
    assert len(changes) == 1
    assert changes[0].old.key.endswith("@before/step_s") and changes[0].new.key.endswith("@after/step_s")
    assert changes[0].verdict == "lower"
    assert source_changes(measurements, "before", "other") == []
    table = changes_table("Trees compared: after against before", changes, "before", "after", drop="@after")
    assert table.header[1:3] == ["before", "after"]
    assert table.rows[0][0] == "drivetrain_trainer"  # the tree is in the column header
