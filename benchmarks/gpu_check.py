# ruff: noqa: RUF001 (tables and messages use typographic signs on purpose)
"""``python -m benchmarks.gpu_check``: the whole GPU check, one command, within 8 minutes on one H100/H200.

The parts run in this order, each as its own process under a time cap, so that a slow part ends
at its cap (killed with its process group) and cannot eat the time of the parts after it:

=============  =====  ==========================================================================
part           cap s  what
=============  =====  ==========================================================================
cuda_tests       125  ``pytest -m cuda`` over every test file that has CUDA-marked tests
ceiling           15  the card's bf16 matmul rate (MFU's denominator)
gpt_eager         40  111 M GPT, eager: raw, drivetrain Trainer and Accelerator, Lightning, Accelerate
gpt_compile       80  the same, ``torch.compile``
fp8              120  4096-wide GPT: bf16 eager / + compile / fp8 + compile, raw (torchao), both doors
overhead          30  111 M GPT at batch 1 (launch-bound): raw and both doors, host CPU per step
checkpoint        40  checkpoint stall: synchronous save against AsyncCheckpointIO on the GPU
=============  =====  ==========================================================================

450 s in all, plus start-up. A table's process also stops starting rounds well before its cap
(``seconds``), so it normally ends on its own with every variant's final loss; if it is killed
anyway, the rounds it finished were already written down and are reported. Results are written
after every part (``gpu-latest.json``/``.md``, ``gpu-cuda-tests.txt``, ``gpu-check.log`` in
``--output-dir``, copied to ``--copy-to``), so what was measured survives a lease that ends early.

``--dry-run`` runs the same programs on the CPU with tiny sizes and at least 3 rounds (the CUDA
tests are collected and skip), writing ``gpu-dry-run.*`` to a scratch folder unless told
otherwise: what can fail on a CPU fails here, not on the leased GPU. The exit status is non-zero
when a test failed, a variant failed, or a fairness check failed; a missed target is a finding.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import gpu_tables
from benchmarks.cases.common import CONFIG_VARIABLE
from benchmarks.harness import REPO_ROOT, base_environment, parse_result
from benchmarks.intervals import Measurement, Scale
from benchmarks.report import CaseResult, Table, describe_machine, fmt_measurement, fmt_seconds, write_results

GPU_SCRIPTS = REPO_ROOT / "benchmarks" / "cases" / "gpu"
TESTS_CAP_S = 125.0
CEILING_CAP_S = 15.0
CHECKPOINT_CAP_S = 40.0
DRY_CAP_S = 60.0
#: A table's program stops starting rounds this long before its cap once it has 3 (the last round,
#: the stop, the final losses and the exit fit in it), and never starts one that would end later
#: than HARD_MARGIN_S before the cap.
STOP_MARGIN_S = 15.0
HARD_MARGIN_S = 6.0
PREAMBLE = (
    "Each training table ran in one process: every variant built once, the variants taking turns in blocks of "
    "optimizer steps (Williams order), each block timed after the GPU finished it. Step times are medians of the "
    "blocks; ratios are 20 % trimmed means of the paired rounds' ratios with their 95 % bootstrap interval "
    "[low, high]. A target is met or missed only when its whole interval is on one side of the limit, undecided "
    'otherwise. See benchmarks/README.md, "The GPU check".'
)
PARTS = ("cuda_tests", "ceiling", *(spec.name for spec in gpu_tables.TABLES), "checkpoint")


@dataclass
class Ran:
    """What one part's process left: its result line, its output, its error (None when it ended well)."""

    result: dict[str, Any] | None
    output: str
    error: str | None
    seconds: float


def run_part(command: Sequence[str], config: dict[str, Any] | None, cap_s: float, cwd: Path) -> Ran:
    """Run ``command`` (one process group) for at most ``cap_s`` seconds; read its ``BENCH_RESULT`` line."""
    env = base_environment(os.cpu_count() or 1)
    env["PYTHONUNBUFFERED"] = "1"
    if config is not None:
        env[CONFIG_VARIABLE] = json.dumps(config)
    started = time.monotonic()
    process = subprocess.Popen(
        list(command),
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=max(cap_s, 1.0))
    except subprocess.TimeoutExpired:
        _kill(process)
        output, _ = process.communicate()
        return Ran(
            parse_result(output),
            output,
            f"stopped at its time cap of {cap_s:.0f} s",
            time.monotonic() - started,
        )
    except BaseException:
        _kill(process)
        raise
    seconds = time.monotonic() - started
    result = parse_result(output)
    if process.returncode != 0:
        last = output.strip().splitlines()[-1] if output.strip() else ""
        return Ran(result, output, f"exit code {process.returncode}: {last}", seconds)
    if config is not None and result is None:
        return Ran(None, output, "no BENCH_RESULT line", seconds)
    return Ran(result, output, None, seconds)


def _kill(process: subprocess.Popen[str]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def cuda_test_files() -> list[str]:
    """Every test file with a CUDA-marked test, relative to the repository."""
    return sorted(
        str(path.relative_to(REPO_ROOT))
        for path in (REPO_ROOT / "tests").rglob("test_*.py")
        if "pytest.mark.cuda" in path.read_text(encoding="utf-8", errors="replace")
    )


_SUMMARY = re.compile(r"(\b\d+ (passed|failed|skipped|errors?|deselected)\b|\bno tests ran\b).* in [\d.]+s\b")


def pytest_counts(output: str) -> tuple[dict[str, int], str]:
    """The counts of pytest's final summary line in ``output``, and that line ("" if there is none).

    The summary is the last line that looks like one, not the last line: anything printed after it
    (a warning at interpreter exit, say) must not turn every count into 0.
    """
    counts = {kind: 0 for kind in ("passed", "failed", "skipped", "error", "deselected")}
    summary = next((line.strip() for line in reversed(output.splitlines()) if _SUMMARY.search(line)), "")
    for number, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", summary):
        counts[kind.rstrip("s") if kind.startswith("error") else kind] += int(number)
    return counts, summary


def run_tests(python: str, cap_s: float, log: Path) -> CaseResult:
    files = cuda_test_files()
    command = [python, "-m", "pytest", "-m", "cuda", "-q", "-rs", "-p", "no:cacheprovider", *files]
    ran = run_part(command, None, cap_s, REPO_ROOT)
    log.write_text(f"# {' '.join(command[1:])}\n# {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n{ran.output}")
    counts, summary = pytest_counts(ran.output)
    outcome = CaseResult(
        "cuda_tests",
        "CUDA-marked tests",
        f"`pytest -m cuda` over the {len(files)} test files with CUDA-marked tests ({ran.seconds:.0f} s); "
        f"the log is [`{log.name}`]({log.name}).",
    )
    outcome.tables.append(
        Table(
            "",
            ["passed", "failed", "errors", "skipped", "deselected"],
            [[str(counts[k]) for k in ("passed", "failed", "error", "skipped", "deselected")]],
        )
    )
    if counts["failed"] or counts["error"]:
        outcome.problems.append(f"cuda tests: {summary}")
    elif not summary and ran.error is None:
        outcome.problems.append("cuda tests: pytest ended without its summary line; see the log")
    elif ran.error is not None and "exit code 5" not in ran.error:
        outcome.problems.append(f"cuda tests: {ran.error}")
    outcome.data = {"files": files, "counts": counts, "summary": summary}
    return outcome


def run_ceiling(python: str, cap_s: float, scratch: Path) -> tuple[dict[str, Any] | None, CaseResult]:
    ran = run_part(
        [python, str(GPU_SCRIPTS / "ceiling.py")], {"warmup_steps": 0, "timed_steps": 0}, cap_s, scratch
    )
    outcome = CaseResult(
        "ceiling",
        "bf16 matmul ceiling",
        "An 8192³ bf16 matrix product on random data, median of 30 after warm-up.",
    )
    if ran.error is not None or ran.result is None:
        outcome.problems.append(f"ceiling: {ran.error}")
        return None, outcome
    outcome.tables.append(
        Table("", ["GPU", "bf16 TFLOP/s"], [[ran.result["gpu"], f"{ran.result['tflops']:.0f}"]])
    )
    outcome.data = ran.result
    return ran.result, outcome


def run_table(
    spec: gpu_tables.TableSpec,
    python: str,
    cap_s: float,
    scratch: Path,
    *,
    dry: bool,
    peers: bool,
    peak: float | None,
) -> CaseResult:
    record = scratch / f"{spec.name}.jsonl"
    config = gpu_tables.program_config(
        spec, dry=dry, peers=peers, seconds=max(cap_s - STOP_MARGIN_S, 1.0), record=str(record)
    )
    ran = run_part([python, str(GPU_SCRIPTS / "ab_program.py")], config, cap_s, scratch)
    records = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    outcome = gpu_tables.analyse(spec, config, ran.result, records, ran.error, peak)
    outcome.notes.append(gpu_tables.mfu_note(peak))
    outcome.data["output_tail"] = ran.output[-4000:]
    return outcome


def run_checkpoint(python: str, cap_s: float, scratch: Path, *, dry: bool) -> CaseResult:
    record = scratch / "checkpoint.jsonl"
    config = {
        "size": "gpt",
        "seed": 0,
        "lr": 6e-4,
        "dry_run": dry,
        "rounds": 3 if dry else 6,
        "warmup_steps": 0,
        "timed_steps": 0,
        # No final losses to take after the rounds: only the last round and the clean-up.
        "seconds": max(cap_s - 10.0, 1.0),
        "hard_seconds": max(cap_s - 4.0, 1.0),
        "record": str(record),
        "directory": str(scratch),
    }
    ran = run_part([python, str(GPU_SCRIPTS / "checkpoint_stall.py")], config, cap_s, scratch)
    rounds = (
        ran.result["rounds"]
        if ran.result
        else [json.loads(line) for line in record.read_text().splitlines()]
        if record.exists()
        else []
    )
    outcome = CaseResult(
        "checkpoint",
        "Checkpoint stall: synchronous save against AsyncCheckpointIO" + (" (CPU dry run)" if dry else ""),
        f"The raw loop trains the benchmark GPT ({gpu_tables.parameters(config)}); its checkpoint is the model's and AdamW's state "
        f"({(ran.result or {}).get('state_bytes', 0) / 2**30:.2f} GiB). Per round, in alternating order: a "
        "synchronous `TorchCheckpointIO` save (host time), and an `AsyncCheckpointIO` save followed by one step, "
        "waited for on the GPU; the stall is that time minus the median plain step measured just before. The first "
        "background save, which pins the host buffers, is the warm-up and not a round.",
    )
    if ran.error is not None:
        outcome.problems.append(f"checkpoint: {ran.error}")
    if rounds:
        stall = [r["async_stall_s"] for r in rounds]
        by_sync = Measurement(
            "gpu/checkpoint/stall_over_sync",
            "background save stall over the synchronous save",
            Scale.LINEAR,
            "× sync save",
            [[r["async_stall_s"] / r["sync_save_s"] for r in rounds]],
            0.05,
        )
        by_step = Measurement(
            "gpu/checkpoint/stall_over_step",
            "background save stall over one training step",
            Scale.LINEAR,
            "× step",
            [[r["async_stall_s"] / r["step_s"] for r in rounds]],
            1.0,
        )
        seconds = Measurement("gpu/checkpoint/stall_s", "background save stall", Scale.LINEAR, "s", [stall])
        outcome.measurements = [by_sync, by_step, seconds]
        outcome.tables.append(
            Table(
                "",
                [
                    "plain step",
                    "synchronous save",
                    "background save: call",
                    "background save: stall [95 %]",
                    "stall / sync save",
                    "stall / step",
                ],
                [
                    [
                        fmt_seconds(statistics.median(r["step_s"] for r in rounds)),
                        fmt_seconds(statistics.median(r["sync_save_s"] for r in rounds)),
                        fmt_seconds(statistics.median(r["async_call_s"] for r in rounds)),
                        fmt_measurement(seconds, signed=True),
                        fmt_measurement(by_sync),
                        fmt_measurement(by_step),
                    ]
                ],
            )
        )
        outcome.notes.append(f"{len(rounds)} round(s).")
    if len(rounds) < 3:
        outcome.problems.append(f"checkpoint: {len(rounds)} round(s), fewer than the 3 an interval needs")
    if ran.result and ran.result.get("first_async_stall_s") is not None:
        outcome.notes.append(
            f"First background save (pins the host buffers): stall {fmt_seconds(ran.result['first_async_stall_s'])}."
        )
    outcome.data = {
        "config": config,
        "result": ran.result,
        "rounds": rounds,
        "error": ran.error,
        "output_tail": ran.output[-4000:],
    }
    return outcome


def probe(python: str, code: str) -> bool:
    done = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, env=base_environment(1), timeout=120
    )
    return done.returncode == 0 and done.stdout.strip().endswith("yes")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="the same programs on the CPU, tiny sizes (checks only)"
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=None,
        help="where results go (default: benchmarks/results; a dry run: a scratch folder)",
    )
    parser.add_argument(
        "--copy-to",
        type=Path,
        default=None,
        help="also copy the result files here after every part (the device's $OUT)",
    )
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs every part")
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}"
    )
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {unknown}; choose from {', '.join(PARTS)}")
    dry = args.dry_run
    output = args.output_dir or (
        Path(tempfile.mkdtemp(prefix="gpu-check-dry-")) if dry else REPO_ROOT / "benchmarks" / "results"
    )
    output.mkdir(parents=True, exist_ok=True)
    stem = "gpu-dry-run" if dry else "gpu-latest"
    started = time.monotonic()
    log_path = output / "gpu-check.log"
    log_lines: list[str] = []

    def log(line: str) -> None:
        stamped = f"[{time.monotonic() - started:6.1f} s] {line}"
        print(stamped, file=sys.stderr, flush=True)
        log_lines.append(stamped)

    if not dry and not probe(
        args.python, "import torch; print('yes' if torch.cuda.is_available() else 'no')"
    ):
        log("no CUDA GPU for this interpreter: use --dry-run on a machine without one")
        return 2
    machine = describe_machine()
    machine["check"] = "CPU dry run" if dry else "GPU check"
    peers = probe(args.python, "import lightning, accelerate; print('yes')")
    float8 = probe(
        args.python,
        "import torch, torchao.float8; print('yes' if "
        + ("True" if dry else "torch.cuda.get_device_capability() >= (8, 9)")
        + " else 'no')",
    )
    log(
        f"{machine['check']}: parts {', '.join(parts)}; peers {'found' if peers else 'not installed'}; float8 {'available' if float8 else 'not available'}"
    )
    results: list[CaseResult] = []
    peak: float | None = None

    def cap(full: float) -> float:
        return DRY_CAP_S if dry else full

    def publish() -> None:
        gpu_machine = dict(machine)
        if peak:
            gpu_machine["gpu"] = (
                f"{ceiling_info['gpu']} (driver {ceiling_info.get('driver')}, CUDA {ceiling_info.get('cuda')}, torch {ceiling_info.get('torch')}, bf16 matmul {peak / 1e12:.0f} TFLOP/s measured)"
            )
        title = "drivetrain GPU check" + (" (CPU dry run: the numbers mean nothing)" if dry else "")
        write_results(output, stem, title, gpu_machine, results, PREAMBLE)
        log_path.write_text("\n".join(log_lines) + "\n")
        if args.copy_to is not None:
            args.copy_to.mkdir(parents=True, exist_ok=True)
            for name in (f"{stem}.json", f"{stem}.md", "gpu-cuda-tests.txt", log_path.name):
                if (output / name).exists():
                    shutil.copy2(output / name, args.copy_to / name)

    ceiling_info: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch_name:
        scratch = Path(scratch_name)
        for part in parts:
            log(f"== {part}")
            part_started = time.monotonic()
            if part == "cuda_tests":
                outcome = run_tests(args.python, cap(TESTS_CAP_S), output / "gpu-cuda-tests.txt")
            elif part == "ceiling":
                if dry:
                    continue
                info, outcome = run_ceiling(args.python, cap(CEILING_CAP_S), scratch)
                if info is not None:
                    ceiling_info, peak = info, info["tflops"] * 1e12
            elif part == "checkpoint":
                outcome = run_checkpoint(args.python, cap(CHECKPOINT_CAP_S), scratch, dry=dry)
            else:
                spec = next(s for s in gpu_tables.TABLES if s.name == part)
                if spec is gpu_tables.FP8 and not float8:
                    outcome = CaseResult(spec.name, spec.title, "")
                    outcome.skipped = (
                        "torchao cannot be imported, or the GPU has no float8 (compute capability < 8.9)"
                    )
                    outcome.problems.append(
                        f"fp8: {outcome.skipped} (carry the torchao wheel: scripts/gpu-check --prepare)"
                    )
                else:
                    outcome = run_table(
                        spec, args.python, cap(spec.cap_s), scratch, dry=dry, peers=peers, peak=peak
                    )
            results.append(outcome)
            log(
                f"== {part}: {time.monotonic() - part_started:.0f} s"
                + (f"; problems: {len(outcome.problems)}" if outcome.problems else "")
            )
            for problem in outcome.problems:
                log("   " + problem.splitlines()[0])
            publish()
    log(f"total {time.monotonic() - started:.0f} s; results in {output}")
    publish()
    summary = [m for r in results for m in r.measurements if m.limit is not None]
    for measurement in summary:
        print(
            f"{measurement.label}: {fmt_measurement(measurement)} (limit {measurement.limit:.4g}): {measurement.decision.value if measurement.decision else ''}"
        )
    problems = [p for r in results for p in r.problems]
    return 1 if problems else 0


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    # SIGTERM as an exception, so that the running part's process group is killed on the way out.
    signal.signal(signal.SIGTERM, _terminate)
    sys.exit(main())
