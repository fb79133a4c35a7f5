# ruff: noqa: RUF001 (units use typographic signs on purpose)
"""Whole runs of the suite's command line on small settings: A/B, two trees, instruction counts."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from benchmarks.__main__ import main
from benchmarks.cases import ab as ab_case
from benchmarks.cases.ddp.ab import run_ab
from benchmarks.cases.instructions import (
    AGREEMENT,
    QUICK_STEPS,
    STEPS,
    _analyse,
    count_instructions,
    missing_tools,
    per_step,
    read_dumps,
)
from benchmarks.harness import Context, Runner, Sample
from benchmarks.report import CaseResult
from benchmarks.sources import REPO_ROOT, Source


def _case(payload: dict, name: str) -> dict:
    return next(c for c in payload["cases"] if c["name"] == name)


# Four A/B processes (tiny and wide MLP, two trees) and ten import samples: ~40 s idle, ~105 s
# at a load of 6 on 2 cores.
@pytest.mark.timeout(300)
def test_two_trees_are_measured_side_by_side_and_compared(tmp_path: Path) -> None:
    # A second tree: a copy of this checkout's drivetrain package (what `git worktree add` gives).
    other = tmp_path / "other" / "src"
    shutil.copytree(
        REPO_ROOT / "src" / "drivetrain", other / "drivetrain", ignore=shutil.ignore_patterns("__pycache__")
    )
    out = tmp_path / "results"
    code = main(
        [
            "run",
            "--quick",
            "--no-peers",
            "--cases",
            "import_time,ab",
            "--only",
            "drivetrain,drivetrain_accelerator",
            "--drivetrain-src",
            f"main={REPO_ROOT / 'src'}",
            "--drivetrain-src",
            f"copy={other}",
            "--output-dir",
            str(out),
        ]
    )
    assert code == 0
    payload = json.loads((out / "quick.json").read_text())
    assert set(payload["machine"]["drivetrain_sources"]) == {"main", "copy"}
    keys = {m["key"] for case in payload["cases"] for m in case["measurements"]}
    for tree in ("main", "copy"):
        assert f"import_time/drivetrain@{tree}/import_s" in keys
        assert f"ab/tiny/drivetrain_accelerator@{tree}/cpu" in keys
        assert f"ab/wide/drivetrain_accelerator@{tree}/cpu" in keys
    # Each A/B process (tiny and wide MLP) imported drivetrain from its own tree.
    files = {
        name: {s["drivetrain_file"] for s in samples}
        for part in ("tiny", "wide")
        for name, samples in _case(payload, "ab")["data"][part]["samples"].items()
    }
    assert files == {
        "ab@main": {str(REPO_ROOT / "src" / "drivetrain" / "__init__.py")},
        "ab@copy": {str(other / "drivetrain" / "__init__.py")},
        "ab-wide@main": {str(REPO_ROOT / "src" / "drivetrain" / "__init__.py")},
        "ab-wide@copy": {str(other / "drivetrain" / "__init__.py")},
    }
    wide = next(
        m
        for m in _case(payload, "ab")["measurements"]
        if m["key"] == "ab/wide/drivetrain_accelerator@copy/cpu"
    )
    assert wide["limit"] == 1.005 and wide["interval"]["units"] == 6
    ab = _case(payload, "ab")
    accelerator = next(m for m in ab["measurements"] if m["key"] == "ab/tiny/drivetrain_accelerator@copy/cpu")
    assert accelerator["interval"]["units"] == 10 and accelerator["decision"] in (
        "met",
        "missed",
        "undecided",
    )
    text = (out / "quick.md").read_text()
    assert "**Trees compared: copy against main**" in text
    trees = text.split("**Trees compared: copy against main**")[-1]
    assert "| measurement | main | copy | change [95 %] | verdict | target decision |" in trees
    assert "| drivetrain Accelerator, tiny MLP (in-process A/B, CPU time) |" in trees
    assert "| drivetrain Accelerator [copy], tiny MLP (in-process A/B, CPU time) |" in text
    assert "Machine load before:" in text


def _dump(directory: Path, index: int, name: str, total: int) -> None:
    (directory / f"callgrind.123.{index}").write_text(
        f"version: 1\ncreator: callgrind-3.19.0\ndesc: Trigger: Client Request: {name}\n"
        f"summary: {total}\ntotals: {total}\nfl=(1) x.c\n"
    )


def test_instruction_counts_come_from_the_named_dumps(tmp_path: Path) -> None:
    (tmp_path / "callgrind.123").write_text("desc: Trigger: Program termination\ntotals: 999\n")
    for index, (steps, total) in enumerate([(10, 30_000_000), (60, 155_000_000), (110, 280_000_500)]):
        _dump(tmp_path, index + 1, f"raw:{steps}", total)
    counts = read_dumps(tmp_path)
    assert counts == {"raw:10": 30_000_000, "raw:60": 155_000_000, "raw:110": 280_000_500}
    assert per_step(counts, "raw", (10, 60, 110)) == [2_500_000.0, 2_500_010.0]
    assert per_step(counts, "other", (10, 60, 110)) is None


def _counts(name: str, per_step: float, setup: float = 5e6) -> dict[str, int]:
    return {f"{name}:{n}": int(setup + per_step * n) for n in STEPS}


def test_instruction_counts_become_ratios_to_the_raw_loop_of_the_same_process() -> None:
    counts = {**_counts("raw", 2_500_000), **_counts("drivetrain_accelerator", 2_550_000)}
    # A variant whose steps cost differently in the two spans is called out.
    counts["drivetrain_trainer"] = 0
    counts.update({"drivetrain_trainer:10": 30_000_000, "drivetrain_trainer:60": 160_000_000})
    counts["drivetrain_trainer:110"] = 160_000_000 + 2_700_000 * 50
    chosen = {"raw": {}, "drivetrain_accelerator": {}, "drivetrain_trainer": {}}
    sample = Sample(
        "drivetrain@after",
        0,
        1.0,
        result={"on_valgrind": True, "variants": {n: {"final_loss": 0.25} for n in chosen}},
    )
    result = CaseResult("instructions", "Instructions", "")
    rows = _analyse(result, sample, counts, chosen, Source("after", REPO_ROOT / "src"), STEPS, first=True)
    found = {m.key: m for m in result.measurements}
    assert found["instructions/tiny/raw/per_step"].interval.estimate == 2_500_000
    ratio = found["instructions/tiny/drivetrain_accelerator@after/ratio"]
    assert ratio.interval.estimate == pytest.approx(1.02) and ratio.unit == "× raw"
    assert rows[1] == ["drivetrain Accelerator [after]", "2.550 M", "1.020×"]
    assert result.problems == []
    assert len(result.notes) == 1 and result.notes[0].startswith(
        "drivetrain Trainer [after]: the two per-step counts"
    )


def test_a_process_not_under_valgrind_or_with_unequal_losses_is_a_problem() -> None:
    counts = {**_counts("raw", 2_500_000), **_counts("fabric", 2_600_000)}
    losses = {"raw": {"final_loss": 0.25}, "fabric": {"final_loss": 0.3}}
    unequal = Sample("peers", 0, 1.0, result={"on_valgrind": True, "variants": losses})
    result = CaseResult("instructions", "Instructions", "")
    _analyse(result, unequal, counts, {"raw": {}, "fabric": {}}, None, STEPS, first=False)
    assert any(p.startswith("peers: fabric sample 0: final loss 0.3 differs") for p in result.problems)
    assert [m.key for m in result.measurements] == [
        "instructions/tiny/fabric/per_step",
        "instructions/tiny/fabric/ratio",
    ]  # raw is reported from the first process only
    outside = Sample("peers", 0, 1.0, result={"on_valgrind": False, "variants": {}})
    result = CaseResult("instructions", "Instructions", "")
    assert _analyse(result, outside, counts, {"raw": {}}, None, STEPS, first=True) == []
    assert result.problems == ["peers: the program did not run under valgrind; no counts"]


@pytest.mark.skipif(missing_tools() is not None, reason=f"callgrind unavailable: {missing_tools()}")
def test_callgrind_counts_the_same_instructions_for_every_step(tmp_path: Path) -> None:
    runner = Runner(threads=1, timeout_s=600)
    try:
        [(sample, counts)] = count_instructions(
            runner,
            [("raw", sys.executable, None, {"raw": {"script": "raw"}})],
            steps=QUICK_STEPS,
            scratch=tmp_path,
            parallel=1,
        )
    finally:
        runner.close()
    assert sample.error is None, sample.error
    assert sample.result["on_valgrind"] is True
    assert set(counts) == {f"raw:{n}" for n in QUICK_STEPS}
    first, second = per_step(counts, "raw", QUICK_STEPS)
    # Two independent differences of runs give the same count: the measure does not depend on luck.
    assert abs(first - second) <= AGREEMENT * max(first, second)
    assert 1e5 < first < 1e8


# One DDP A/B launch (torchrun, 2 ranks: raw DDP and both doors in turns) and one fresh launch per
# variant: ~25 s idle, ~70 s at a load of 5 on 2 cores.
@pytest.mark.timeout(300)
def test_the_ddp_case_decides_the_steady_step_in_process_and_the_first_step_from_launches(
    tmp_path: Path,
) -> None:
    out = tmp_path / "results"
    assert main(["run", "--quick", "--no-peers", "--cases", "ddp", "--output-dir", str(out)]) == 0
    payload = json.loads((out / "quick.json").read_text())
    ddp = _case(payload, "ddp")
    assert ddp["problems"] == []
    found = {m["key"]: m for m in ddp["measurements"]}
    for door in ("drivetrain_trainer", "drivetrain_accelerator"):
        # The steady-step target is the A/B's rank-0 wall clock; the fresh launches keep only the first step.
        assert found[f"ddp/ab/{door}/wall"]["limit"] == 1.02
        assert found[f"ddp/ab/{door}/wall"]["interval"]["units"] == 6
        assert found[f"ddp/ab/{door}/cpu"]["limit"] is None
        assert found[f"ddp/2proc/{door}/first_step_s"]["limit"] == 0.1
        assert found[f"ddp/2proc/{door}/step_s"]["limit"] is None
    [launch] = ddp["data"]["ab"]["samples"]["ddp-ab"]
    assert launch["world_size"] == 2 and launch["expected_steps"] == 5 + 6 * 5
    variants = launch["variants"]
    assert set(variants) == {"raw", "drivetrain_trainer", "drivetrain_accelerator"}
    for entry in variants.values():
        assert entry["error"] is None and entry["steps"] == 35 and len(entry["wall_s"]) == 6
        assert entry["final_loss"] == pytest.approx(variants["raw"]["final_loss"], rel=1e-5)
    text = (out / "quick.md").read_text()
    assert "**Steady DDP step, in-process A/B: torchrun, 2 ranks, one gloo group;" in text
    assert "| drivetrain Trainer: steady DDP step (in-process A/B, rank 0 wall time) | ≤ 1.02× raw |" in text


def test_an_ab_table_whose_variants_are_not_chosen_starts_no_process(tmp_path: Path) -> None:
    # `--only` a peer without the peers: neither A/B table nor the DDP A/B has anything to compare.
    lines: list[str] = []
    context = Context(
        quick=True, python=sys.executable, peers_python=None, only=frozenset({"fabric"}), log=lines.append
    )
    result = ab_case.run(context)
    assert result.measurements == [] and result.tables == [] and result.problems == []
    assert lines == [
        "ab/tiny: no variant of this table chosen (--only); skipped",
        "ab/wide: no variant of this table chosen (--only); skipped",
    ]
    ddp = CaseResult("ddp", "DDP", "")
    run_ab(context, ddp, {})
    assert ddp.measurements == [] and lines[-1] == "ddp/ab: neither door chosen (--only); skipped"
