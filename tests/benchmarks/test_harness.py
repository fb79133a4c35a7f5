# ruff: noqa: RUF001 (units use typographic signs on purpose)
"""The harness runs variants as fresh processes, interleaved, and reads their result lines."""

from __future__ import annotations

import json
import math
import sys
import venv
from pathlib import Path

import pytest
from benchmarks.harness import Runner, Sample, Variant, compile_bytecode, parse_result
from benchmarks.training import analyse, difference_measurement, ratio_measurement

# A stand-in benchmark script: echoes its config back, plus the start time it was given.
ECHO = (
    "import json, os; c = json.loads(os.environ['BENCH_CONFIG']); "
    "print('noise'); print('BENCH_RESULT ' + json.dumps({'config': c, 't0': os.environ['BENCH_T0'], "
    "'threads': os.environ['OMP_NUM_THREADS'], 'rank': os.environ.get('RANK')}))"
)


def _variant(name: str, code: str, **config: object) -> Variant:
    return Variant(name, name, (sys.executable, "-c", code), config=config)


def test_parse_result_takes_the_last_marked_line() -> None:
    output = 'hello\nBENCH_RESULT {"a": 1}\nBENCH_RESULT {"a": 2}\nbye\n'
    assert parse_result(output) == {"a": 2}
    assert parse_result("no result here") is None


def test_a_sample_gets_its_config_start_time_threads_and_a_clean_environment(monkeypatch) -> None:
    monkeypatch.setenv("RANK", "3")  # as if the suite itself ran under a launcher
    runner = Runner(threads=1)
    try:
        sample = runner.run_once(_variant("echo", ECHO, model="tiny"), {"steps": 5, "model": "wide"})
    finally:
        runner.close()
    assert sample.error is None
    assert sample.result["config"] == {"steps": 5, "model": "tiny"}  # the variant's settings win
    assert float(sample.result["t0"]) > 0
    assert sample.result["threads"] == "1"
    assert sample.result["rank"] is None


def test_bytecode_is_written_once_and_samples_may_reuse_it(monkeypatch, tmp_path: Path) -> None:
    # The sandbox's PYTHONDONTWRITEBYTECODE would make every sample compile the tree under test,
    # which a user's Python does once; the samples must not inherit it either.
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    package = tmp_path / "tree" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 1\n")
    (package / "mod.py").write_text("def f():\n    return 2\n")
    lines: list[str] = []
    assert compile_bytecode(sys.executable, [tmp_path / "tree"], lines.append) is None
    written = sorted(p.name.split(".")[0] for p in (package / "__pycache__").glob("*.pyc"))
    assert written == ["__init__", "mod"]
    assert lines and str(tmp_path / "tree") in lines[0]
    code = "import os, json; print('BENCH_RESULT ' + json.dumps({'flag': os.environ.get('PYTHONDONTWRITEBYTECODE')}))"
    runner = Runner(threads=1)
    try:
        sample = runner.run_once(_variant("env", code), {})
    finally:
        runner.close()
    assert sample.error is None and sample.result == {"flag": None}


def test_a_published_run_compiles_the_installed_packages_a_quick_run_does_not(tmp_path: Path) -> None:
    # An environment scripts/test built holds bytecode only for what the tests imported.
    venv.create(tmp_path / "env", with_pip=False)
    python = str(tmp_path / "env" / "bin" / "python")
    [purelib] = (tmp_path / "env" / "lib").glob("python3*/site-packages")
    (purelib / "installed_package.py").write_text("VALUE = 1\n")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "source.py").write_text("VALUE = 2\n")
    assert compile_bytecode(python, [tree], lambda _: None) is None
    assert (tree / "__pycache__").is_dir() and not (purelib / "__pycache__").exists()
    assert compile_bytecode(python, [tree], lambda _: None, installed=True) is None
    assert [p.name.split(".")[0] for p in (purelib / "__pycache__").glob("*.pyc")] == ["installed_package"]


def test_bytecode_that_cannot_be_written_is_reported(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    problem = compile_bytecode(sys.executable, [broken], lambda _: None)
    assert problem is not None and "compileall failed" in problem and "broken.py" in problem


def test_a_failing_sample_reports_the_exception_line() -> None:
    runner = Runner(threads=1)
    try:
        sample = runner.run_once(_variant("boom", "raise RuntimeError('no front door yet')"), {})
    finally:
        runner.close()
    assert sample.result is None
    assert sample.error.splitlines()[0] == "exit code 1: RuntimeError: no front door yet"


def test_a_sample_past_its_time_limit_is_killed() -> None:
    runner = Runner(threads=1, timeout_s=0.5)
    try:
        sample = runner.run_once(_variant("slow", "import time; time.sleep(30)"), {})
    finally:
        runner.close()
    assert sample.error.startswith("timed out")
    assert sample.wall_s < 10


def test_rounds_interleave_variants_and_a_failed_variant_is_not_retried(tmp_path: Path) -> None:
    order = tmp_path / "order.txt"

    def record(name: str) -> str:
        return f"open({str(order)!r}, 'a').write('{name}\\n'); " + ECHO

    runner = Runner(threads=1, log=lambda _: None)
    try:
        samples = runner.interleave(
            [
                _variant("a", record("a")),
                _variant("bad", f"open({str(order)!r}, 'a').write('bad\\n'); raise SystemExit(2)"),
                _variant("b", record("b")),
            ],
            {},
            rounds=2,
            warmup_rounds=1,
        )
    finally:
        runner.close()
    assert order.read_text().split() == ["a", "bad", "b", "a", "b", "a", "b"]
    assert [s.round for s in samples["a"]] == [0, 1]  # the warm-up round is dropped
    assert len(samples["bad"]) == 1 and samples["bad"][0].error.startswith("exit code 2")


def test_some_variants_take_fewer_rounds_and_rounds_stop_once_precise_enough(tmp_path: Path) -> None:
    order = tmp_path / "order.txt"

    def record(name: str) -> str:
        return f"open({str(order)!r}, 'a').write('{name}\\n'); " + ECHO

    seen: list[int] = []

    def enough(samples: dict[str, list[Sample]]) -> bool:
        seen.append(len(samples["ref"]))
        return len(samples["ref"]) >= 4

    runner = Runner(threads=1, log=lambda _: None)
    try:
        samples = runner.interleave(
            [_variant("ref", record("ref")), _variant("peer", record("peer"))],
            {},
            rounds=6,
            rounds_of={"peer": 2},
            min_rounds=3,
            enough=enough,
        )
    finally:
        runner.close()
    # The peer runs in the first two rounds only, paired with the reference of the same rounds;
    # the check starts after round 3 and ends the rounds after round 4, not at 6.
    assert order.read_text().split() == ["ref", "peer", "ref", "peer", "ref", "ref"]
    assert [s.round for s in samples["peer"]] == [0, 1]
    assert [s.round for s in samples["ref"]] == [0, 1, 2, 3]
    assert seen == [3, 4]


def _sample(name: str, loss: float, steps: int = 10, step_s: float = 0.001) -> Sample:
    return Sample(name, 0, 1.0, result={"final_loss": loss, "steps": steps, "step_s": step_s})


def test_analysis_flags_unfair_comparisons_and_failures() -> None:
    variants = [Variant(n, n, ("x",)) for n in ("raw", "same", "drifted", "short", "broken")]
    samples = {
        "raw": [_sample("raw", 0.25), _sample("raw", 0.25)],
        "same": [_sample("same", 0.25, step_s=0.002)],
        "drifted": [_sample("drifted", 0.3)],
        "short": [_sample("short", 0.25, steps=9)],
        "broken": [Sample("broken", 0, 1.0, error="exit code 1: ImportError: nope")],
    }
    stats, problems = analyse(variants, samples, reference="raw", expected_steps=10, rel_tol=1e-6)
    assert stats["same"]["step_s"].median == 0.002
    assert stats["broken"].error.startswith("exit code 1")
    assert len(problems) == 3
    assert problems[0].startswith("broken failed: exit code 1: ImportError: nope")
    assert any("short sample 0: took 9 optimizer steps" in p for p in problems)
    assert any(p.startswith("drifted sample 0: final loss 0.3") for p in problems)
    assert json.dumps(stats["raw"].as_dict())  # serialisable for the JSON file


def test_ratios_pair_each_variant_with_the_reference_of_the_same_round() -> None:
    def run(name: str, round_index: int, step_s: float | None) -> Sample:
        return Sample(name, round_index, 1.0, result={} if step_s is None else {"step_s": step_s})

    samples = {
        "raw": [run("raw", 0, 1.0), run("raw", 1, 2.0), run("raw", 2, 4.0)],
        # Round 1 lacks a value, round 3 has no raw sample: both are left out, never shifted.
        "x": [run("x", 0, 1.1), run("x", 1, None), run("x", 2, 4.4), run("x", 3, 9.9)],
    }
    measurement = ratio_measurement("case/t/x/step_s", "x", samples, "x", "raw", "step_s", limit=1.2)
    assert measurement.groups == [[pytest.approx(math.log(1.1))], [pytest.approx(math.log(1.1))]]
    assert measurement.interval.estimate == pytest.approx(1.1)
    assert measurement.unit == "× raw"
    difference = difference_measurement("case/t/x/first", "x", samples, "x", "raw", "step_s")
    assert [g[0] for g in difference.groups] == [pytest.approx(0.1), pytest.approx(0.4)]
