# ruff: noqa: RUF001, RUF002, RUF003 (tables, messages and comments use typographic signs on purpose)
"""The DDP case's steady-step part: raw DDP and drivetrain's doors in the same 2 processes (A/B).

Fresh 2-process launches of one program differ in steady step time by 10–20 % on an idle 2-core
machine (three rounds gave intervals of ±15 %), far more than the 2 % limit. Here each launch
(``torchrun``, 2 ranks, one gloo group) holds raw DDP and drivetrain's Trainer and Accelerator,
each with its own model copy (same initialisation) on the same data, advancing in turns of
``BLOCK_STEPS`` steps (``ab_program.py``); a round gives each door's rank-0 block time over raw's
block time of the same round. The decision uses rank 0's wall time (a rank that waits for its
peer in the all-reduce waits on the wall clock, not the CPU clock); the CPU time is shown beside it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.cases.ab import check_processes, per_step_time
from benchmarks.cases.inprocess_variants import LABELS
from benchmarks.harness import Context, Sample, Variant
from benchmarks.intervals import Measurement, Scale, paired_log_ratios
from benchmarks.report import CaseResult, Table, fmt_measurement, fmt_seconds
from benchmarks.sources import Source

PROGRAM = Path(__file__).resolve().parent / "ab_program.py"
PROCESSES = 2
STEP_LIMIT = 1.02
LOSS_REL_TOL = 1e-5  # as the fresh-process DDP runs: the all-reduce may add in another order
DOORS = {
    "drivetrain_trainer": {"script": "drivetrain_trainer", "config": {"devices": PROCESSES}},
    "drivetrain_accelerator": {"script": "drivetrain_accelerator"},
}
CLOCKS = {"wall": "rank 0 wall time", "cpu": "rank 0 CPU time"}


@dataclass(frozen=True)
class Sizing:
    """Rounds per launch, block size, and how many launches (see the README, "How many rounds")."""

    rounds: int
    block_steps: int
    warmup_steps: int
    min_launches: int
    max_launches: int
    budget_s: float
    half_width: float


# A DDP step of the 64→512→512→1 MLP is ~5.5 ms on rank 0 (idle, one thread per rank), a block of
# 20 steps ~0.11 s, a round of the 3 variants ~0.35 s, a launch of 36 rounds (6 cycles of the
# 6-row Williams design for 3 variants) ~13 s plus ~5 s of start-up and warm-up. Three launches
# (108 rounds) give a half-width of about 2.2·σ/√108 ≈ 0.21·σ: ±0.5 % when the per-block spread
# σ of the log ratio is ≤ 2.4 %; more launches, up to 4 or 75 s per tree, until both doors are
# known within ±0.5 % (the limit is 2 %; the doors' own Python is ~20–40 µs of a 5.5 ms step).
FULL = Sizing(
    rounds=36,
    block_steps=20,
    warmup_steps=20,
    min_launches=3,
    max_launches=5,
    budget_s=90.0,
    half_width=0.005,
)
QUICK = Sizing(
    rounds=6, block_steps=5, warmup_steps=5, min_launches=1, max_launches=1, budget_s=0.0, half_width=1.0
)
# Wider than this at the end: the report warns that the steady-step targets could not be resolved.
WARN_WIDTH = 0.01


def sizing_for(context: Context) -> Sizing:
    if context.quick:
        return QUICK
    return FULL if context.rounds is None else Sizing(**{**FULL.__dict__, "rounds": context.rounds})


def run_ab(context: Context, result: CaseResult, base_config: dict[str, Any]) -> None:
    """Run the launches, add the measurements (with the targets) and the table to ``result``."""
    sizing = sizing_for(context)
    chosen = {"raw": {"script": "raw"}}
    chosen.update({n: s for n, s in DOORS.items() if context.only is None or n in context.only})
    if len(chosen) == 1:
        context.log("ddp/ab: neither door chosen (--only); skipped")
        return
    context.log(
        f"ddp/ab: {len(context.sources)} tree(s), {sizing.min_launches}–{sizing.max_launches} launch(es) each "
        f"× {sizing.rounds} rounds of {sizing.block_steps}-step blocks"
    )
    runner = context.runner(threads=max(1, context.cores // PROCESSES), timeout_s=300)
    samples: dict[str, list[Sample]] = {}
    started = time.monotonic()
    launches = 0
    try:
        while launches < sizing.max_launches:
            for source in context.sources:
                variant = _launch(context.python, source, chosen, sizing, base_config, launches)
                sample = runner.run_once(variant, {}, launches)
                context.log(
                    f"  launch {launches + 1}{source.suffix}: "
                    f"{'ok' if sample.error is None else 'FAILED'} ({sample.wall_s:.1f} s)"
                )
                samples.setdefault(variant.name, []).append(sample)
            launches += 1
            if launches < sizing.min_launches:
                continue
            so_far = [m for s in context.sources for m in measurements(_good(samples, s), chosen, s)]
            if precise_enough(so_far, sizing.half_width) or time.monotonic() - started > sizing.budget_s:
                break
    finally:
        runner.close()

    rows: list[list[str]] = []
    found: list[Measurement] = []
    for source in context.sources:
        runs = samples.get(f"ddp-ab{source.suffix}", [])
        failed = [s.error for s in runs if s.error is not None]
        if failed:
            result.problems.append(f"DDP A/B launch{source.suffix} failed: {failed[0]}")
        good = _good(samples, source)
        result.problems += [
            p.replace("A/B", "DDP A/B", 1)
            for p in check_processes(good, chosen, source, rel_tol=LOSS_REL_TOL)
        ]
        these = measurements(good, chosen, source)
        found += these
        rows += _rows(good, chosen, source, these, sizing.block_steps)
    result.measurements += found
    if not context.quick and not precise_enough(found, WARN_WIDTH):
        result.warnings.append(
            f"DDP A/B: a door's steady-step ratio is known only to worse than ±{WARN_WIDTH:.0%} after {launches} "
            f"launch(es) (a busy machine): rerun on a quiet one"
        )
    more = (
        f"; from {sizing.min_launches}, more launches are added, up to {sizing.max_launches}, until both doors "
        f"are known within ±{sizing.half_width:.1%}"
        if sizing.max_launches > sizing.min_launches
        else ""
    )
    title = (
        f"Steady DDP step, in-process A/B: torchrun, 2 ranks, one gloo group; {sizing.rounds} rounds of "
        f"{sizing.block_steps}-step blocks per launch after {sizing.warmup_steps} warm-up steps, {launches} "
        f"launch(es) per drivetrain tree{more}"
    )
    header = ["variant", "rank 0 step (wall)", "× raw, wall [95 %]", "rank 0 step (CPU)", "× raw, CPU [95 %]"]
    result.tables.append(Table(title, header, rows))
    result.data["ab"] = {
        "rounds_per_launch": sizing.rounds,
        "block_steps": sizing.block_steps,
        "warmup_steps": sizing.warmup_steps,
        "launches": launches,
        "samples": {
            name: [s.result if s.result is not None else {"error": s.error} for s in runs]
            for name, runs in samples.items()
        },
    }


def _launch(
    python: str, source: Source, chosen: dict[str, Any], sizing: Sizing, base: dict[str, Any], index: int
) -> Variant:
    config = {
        **base,
        "variants": chosen,
        "rounds": sizing.rounds,
        "block_steps": sizing.block_steps,
        "warmup_steps": sizing.warmup_steps,
        "timed_steps": 0,
        "process_index": index,
    }
    command = (
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={PROCESSES}",
        str(PROGRAM),
    )
    return Variant(f"ddp-ab{source.suffix}", "DDP A/B launch", command, config=config, source=source)


def _good(samples: dict[str, list[Sample]], source: Source) -> list[dict[str, Any]]:
    return [s.result for s in samples.get(f"ddp-ab{source.suffix}", []) if s.result is not None]


def measurements(results: list[dict[str, Any]], chosen: dict[str, Any], source: Source) -> list[Measurement]:
    """Each door's rank-0 block time over raw's, per clock; the wall clock carries the target."""
    found = []
    for name in chosen:
        if name == "raw":
            continue
        for clock in ("wall", "cpu"):
            groups = [
                paired_log_ratios(r["variants"][name][f"{clock}_s"], r["variants"]["raw"][f"{clock}_s"])
                for r in results
                if not r["variants"].get(name, {}).get("error") and not r["variants"]["raw"].get("error")
            ]
            found.append(
                Measurement(
                    f"ddp/ab/{name}{source.suffix}/{clock}",
                    f"{LABELS[name]}{source.label_suffix}: steady DDP step (in-process A/B, {CLOCKS[clock]})",
                    Scale.RATIO,
                    "× raw",
                    groups,
                    STEP_LIMIT if clock == "wall" else None,
                )
            )
    return found


def precise_enough(found: list[Measurement], half_width: float) -> bool:
    """Whether every targeted (wall-clock) ratio's interval is within ``half_width`` of it (log scale)."""
    for measurement in found:
        if measurement.limit is None:
            continue
        interval = measurement.interval
        if interval is None or interval.low is None or interval.high is None:
            return False
        if (math.log(interval.high) - math.log(interval.low)) / 2 > half_width:
            return False
    return True


def _rows(
    results: list[dict[str, Any]],
    chosen: dict[str, Any],
    source: Source,
    found: list[Measurement],
    block_steps: int,
) -> list[list[str]]:
    by_key = {m.key: m for m in found}
    rows = []
    for name in chosen:
        label = LABELS[name] + source.label_suffix
        wall = fmt_seconds(per_step_time(results, name, "wall", block_steps))
        cpu = fmt_seconds(per_step_time(results, name, "cpu", block_steps))
        if name == "raw":
            rows.append([label + " DDP", wall, "1", cpu, "1"])
            continue
        rows.append(
            [
                label,
                wall,
                fmt_measurement(by_key.get(f"ddp/ab/{name}{source.suffix}/wall")),
                cpu,
                fmt_measurement(by_key.get(f"ddp/ab/{name}{source.suffix}/cpu")),
            ]
        )
    return rows
