"""The GPU check: its dry run on the CPU (what CI can show before a GPU is lent), and its pieces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from benchmarks.cases import gpt

from benchmarks import gpu_check, gpu_tables

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.multiprocess
@pytest.mark.timeout(600)  # ~45 s of CPU time; several minutes of wall time on a busy 2-core machine
def test_the_dry_run_runs_every_part_on_the_cpu(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(REPO_ROOT / "scripts" / "gpu-check"), "--dry-run", "--output-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu-dry-run.json").read_text())
    cases = {case["name"]: case for case in report["cases"]}
    assert list(cases) == ["cuda_tests", "gpt_eager", "gpt_compile", "fp8", "overhead", "checkpoint"]
    assert all(not case["problems"] for case in cases.values()), [c["problems"] for c in cases.values()]
    # The CUDA tests were collected (and skip here), and their log is kept.
    assert cases["cuda_tests"]["data"]["counts"]["skipped"] >= 10
    assert "skipped" in (tmp_path / "gpu-cuda-tests.txt").read_text()
    # Every variant of every table trained its steps in at least 3 interleaved rounds, to the same loss.
    for name in ("gpt_eager", "gpt_compile", "fp8", "overhead"):
        result = cases[name]["data"]["result"]
        for variant, entry in result["variants"].items():
            assert entry["error"] is None, (name, variant, entry["error"])
            assert len(entry["wall_s"]) >= 3 and entry["steps"] == result["expected_steps"], (name, variant)
            assert entry["final_loss"] is not None
    fp8 = cases["fp8"]["data"]["result"]["variants"]
    assert {"raw_fp8_compile", "trainer_fp8", "trainer_fp8_layers", "accelerator_fp8"} <= set(fp8)
    assert fp8["trainer_fp8"]["final_loss"] == pytest.approx(fp8["raw_fp8_compile"]["final_loss"], rel=1e-3)
    assert fp8["trainer_fp8"]["final_loss"] != fp8["raw_bf16_compile"]["final_loss"]  # float8 did run
    assert len(cases["checkpoint"]["data"]["rounds"]) == 3
    markdown = (tmp_path / "gpu-dry-run.md").read_text()
    assert "## Targets" in markdown and "Trainer fp8 against raw torchao fp8 + compile" in markdown
    assert (tmp_path / "gpu-check.log").exists()


def test_the_raw_float8_variant_converts_the_layers_drivetrain_converts() -> None:
    pytest.importorskip("torchao")
    from drivetrain.plugins.precision.fp8_layers import plan_layers

    for size in ("fp8", "fp8-dry"):
        layers, width, heads, vocabulary, context, _ = gpt.SIZES[size]
        with torch.device("meta"):
            model = gpt.GPT(layers, width, heads, vocabulary, context)
        chosen = gpt.float8_layers(model)
        assert chosen == plan_layers(model, granularity="tensorwise").float8
        assert chosen  # something converts, also in the dry run
    # The full size converts every block's linear layer but the very first (the head is the last).
    assert len(chosen) >= 1 and len(gpt.float8_layers(_meta_gpt("fp8"))) == 4 * 2 - 1


def _meta_gpt(size: str) -> gpt.GPT:
    layers, width, heads, vocabulary, context, _ = gpt.SIZES[size]
    with torch.device("meta"):
        return gpt.GPT(layers, width, heads, vocabulary, context)


def test_the_time_caps_fit_eight_minutes() -> None:
    total = (
        gpu_check.TESTS_CAP_S
        + gpu_check.CEILING_CAP_S
        + gpu_check.CHECKPOINT_CAP_S
        + sum(spec.cap_s for spec in gpu_tables.TABLES)
    )
    assert total <= 460, total
    assert all(spec.cap_s > gpu_check.STOP_MARGIN_S for spec in gpu_tables.TABLES)


def test_a_table_killed_at_its_cap_reports_the_rounds_it_wrote_down() -> None:
    config = gpu_tables.program_config(gpu_tables.OVERHEAD, dry=True, peers=False, seconds=10, record="-")
    records = [
        {
            "round": 0,
            "blocks": {
                "raw": [0.10, 0.09],
                "drivetrain_trainer": [0.11, 0.1],
                "drivetrain_accelerator": [0.1, 0.1],
            },
        },
        {"round": 1, "blocks": {"raw": [0.10, 0.09], "drivetrain_trainer": [0.11, 0.1]}},
    ]
    outcome = gpu_tables.analyse(
        gpu_tables.OVERHEAD, config, None, records, "stopped at its time cap of 30 s", None
    )
    assert outcome.problems == [
        "overhead: stopped at its time cap of 30 s",
        "overhead: 1 round(s) per variant, fewer than the 3 an interval needs (the time cap came first)",
    ]
    trainer = next(m for m in outcome.measurements if "Trainer" in m.label)
    assert trainer.interval is not None and trainer.interval.units == 2
    assert trainer.interval.estimate == pytest.approx(1.1)
    assert any("1 of 3 planned rounds" in note and "fewer than 3 rounds" in note for note in outcome.notes)


def test_the_cuda_test_files_are_found_by_their_marker() -> None:
    files = gpu_check.cuda_test_files()
    assert "tests/plugins/precision/test_fp8.py" in files
    assert "tests/plugins/io/test_device_staging.py" in files
    assert "tests/benchmarks/test_no_device_sync_on_the_step_path.py" in files
    assert all(Path(REPO_ROOT, f).exists() for f in files)


def test_without_a_gpu_the_real_check_refuses_and_points_to_the_dry_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert gpu_check.main(["--python", sys.executable, "--parts", "ceiling"]) == 2
    assert "use --dry-run" in capsys.readouterr().err


def test_the_cuda_tests_counts_come_from_pytests_summary_even_with_lines_after_it() -> None:
    quiet = "ssss\n2 passed, 12 skipped, 1990 deselected in 3.21s\n"
    counts, summary = gpu_check.pytest_counts(
        quiet + "Exception ignored in atexit callback: ...\nKeyError: 'X'\n"
    )
    assert summary == "2 passed, 12 skipped, 1990 deselected in 3.21s"
    assert counts == {"passed": 2, "failed": 0, "skipped": 12, "error": 0, "deselected": 1990}
    decorated = "==== 1 failed, 3 errors, 7 skipped in 0.50s (0:00:00) ====\n"
    assert gpu_check.pytest_counts(decorated)[0] == {
        "passed": 0,
        "failed": 1,
        "skipped": 7,
        "error": 3,
        "deselected": 0,
    }
    # A "3 passed" inside a test's own output is not the summary; no summary line at all reads as none.
    assert gpu_check.pytest_counts("it printed 3 passed\nTraceback ...\n") == (
        {"passed": 0, "failed": 0, "skipped": 0, "error": 0, "deselected": 0},
        "",
    )
    assert gpu_check.pytest_counts("no tests ran in 0.01s\n")[1] == "no tests ran in 0.01s"
