# ruff: noqa: RUF001, RUF002, RUF003 (tables, messages and comments use typographic signs on purpose)
"""Case: per-step overhead, every variant in one process, in interleaved blocks (tiny and wide MLP).

The overhead-bound targets (Trainer + ``self.log`` ≤ 1.05× raw, Accelerator ≤ 1.02× raw, tiny MLP)
are a few percent, and the compute-bound one (both doors ≤ 1.005× raw, wide MLP) half a percent;
fresh processes of one program differ by more than that, so they are decided here. Each process
builds raw PyTorch, drivetrain's doors and, for the tiny MLP (in the peers' interpreter, with
drivetrain on ``PYTHONPATH``), Lightning's Trainer, Fabric and Accelerate, and runs them in turns
of a few steps, round after round (``benchmarks.inprocess``). One round gives each variant's block
time over raw's block time of that round; several processes (their memory layout and order
differ) give the two-level bootstrap its outer level.

Clocks: the decision uses the process's CPU time per block (one intra-op thread, so the work of a
step is all on the CPU clock, and time the kernel gave to other programs is not); wall time is
shown beside it. With several drivetrain trees, each tree gets its own processes (a process can
import one drivetrain), alternating with the others', each with raw as its reference; the
peers run in the first tree's processes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.cases.inprocess_variants import DRIVETRAIN, LABELS, MODEL, PEERS, RAW, WIDE_MODEL
from benchmarks.harness import Context, Runner, Sample, Variant
from benchmarks.intervals import Measurement, Scale, paired_log_ratios
from benchmarks.report import CaseResult, Table, fmt_measurement, fmt_seconds
from benchmarks.sources import Source
from benchmarks.stats import check_same_loss

PROGRAM = Path(__file__).resolve().parent / "program.py"
LOSS_REL_TOL = 1e-6
CLOCKS = {"cpu": "CPU time", "wall": "wall time"}
# Intervals wider than this at the end are worth a warning: the targets cannot be resolved.
WIDE = 0.01


@dataclass(frozen=True)
class Part:
    """One model measured in A/B processes: its variants, block sizes, sizing and targets.

    ``half_width`` is the precision (log scale) at which no further process starts; ``warn_width``
    the one beyond which the report warns that the targets could not be resolved.
    """

    model: str
    title: str
    settings: dict[str, Any]
    block_steps: int
    warmup_steps: int
    rounds: int
    min_processes: int
    max_processes: int
    budget_s: float
    half_width: float
    warn_width: float
    limits: dict[str, float]
    with_peers: bool
    drivetrain: tuple[str, ...]


# Sizing (README, "How many rounds").
# Tiny MLP: a process runs 40 rounds of 50-step blocks (~0.3 s a round for the 8 variants on a quiet
# machine, so ~15 s with start-up); at least 3 processes, so that differences between processes
# (memory layout) reach the interval; then one more at a time until every drivetrain ratio is known
# within ±0.8 % (comfortably inside the ±1 % asked for), or the budget is spent. With a per-round
# spread σ of the log ratio the half-width is about 2·σ/√(rounds·(1−trim)): 120 rounds reach ±0.8 %
# when σ ≤ 4 %, 320 rounds when σ ≤ 6.5 %. Blocks of 50 steps hold exactly one of the frameworks'
# every-50-steps logging points (`log_every_n_steps`), so periodic work lands in every block alike.
TINY = Part(
    model="tiny",
    title="tiny MLP 32→64→1",
    settings=MODEL,
    block_steps=50,
    warmup_steps=100,
    rounds=40,
    min_processes=3,
    max_processes=8,
    budget_s=120.0,
    half_width=0.008,
    warn_width=WIDE,
    limits={"drivetrain_trainer_log": 1.05, "drivetrain_accelerator": 1.02},
    with_peers=True,
    drivetrain=tuple(DRIVETRAIN),
)
# Wide MLP (compute-bound; target ≤ 1.005× raw for both doors): raw and the two doors only (the peers
# keep their fresh-process row in the step-time case). A step is ~29 ms of CPU time on one thread
# (~20–40 µs of it a door's Python, ~0.1 %). The tiny MLP's idle runs show a per-block spread of
# 1–9 % on 35 ms blocks, i.e. ~1–2 ms of interruptions per block, which shrinks relative to a longer
# block: 8-step blocks (~0.23 s) put it near 0.75 %. A round of 3 variants is ~0.7 s, a process of 18
# rounds (3 cycles of the 6-row Williams design for 3 variants) ~16 s with start-up. 3 processes
# (54 rounds) give a half-width of 2.2·σ/√54 ≈ 0.3·σ: ±0.22 % at σ = 0.75 %, ±0.45 % at σ = 1.5 %.
# More processes are added, up to 5 or 60 s, until both doors are known within ±0.3 %.
WIDE_PART = Part(
    model="wide",
    title="wide MLP 256→2048→2048→1",
    settings=WIDE_MODEL,
    block_steps=8,
    warmup_steps=3,
    rounds=18,
    min_processes=3,
    max_processes=5,
    budget_s=60.0,
    half_width=0.003,
    warn_width=0.005,
    limits={"drivetrain_trainer": 1.005, "drivetrain_accelerator": 1.005},
    with_peers=False,
    drivetrain=("drivetrain_trainer", "drivetrain_accelerator"),
)
PARTS = (TINY, WIDE_PART)
QUICK = {"tiny": (10, 50), "wide": (6, 2)}  # quick runs: (rounds, block steps), one process


def groups(context: Context, part: Part = TINY) -> list[tuple[Source, dict[str, dict[str, Any]]]]:
    """One group of variants per drivetrain tree (raw first); the peers join the first group."""
    found = []
    for index, source in enumerate(context.sources):
        chosen: dict[str, dict[str, Any]] = {**RAW, **{n: DRIVETRAIN[n] for n in part.drivetrain}}
        if index == 0 and context.peers_python is not None and part.with_peers:
            chosen.update(PEERS)
        if context.only is not None:
            chosen = {n: s for n, s in chosen.items() if n == "raw" or n in context.only}
        found.append((source, chosen))
    return found


@dataclass(frozen=True)
class Plan:
    """How many processes and rounds: at least ``min_processes``, then more until every drivetrain
    ratio's interval is within ``half_width`` (log scale) or ``budget_s`` is spent, at most
    ``max_processes``."""

    rounds: int
    block_steps: int
    min_processes: int
    max_processes: int
    budget_s: float
    half_width: float


def plan_for(context: Context, groups: int, part: Part = TINY) -> Plan:
    if context.quick:
        rounds, block = QUICK[part.model]
        return Plan(rounds, block, 1, 1, 0.0, part.half_width)
    return Plan(
        context.rounds or part.rounds,
        part.block_steps,
        part.min_processes,
        part.max_processes,
        part.budget_s * groups,
        part.half_width,
    )


def precise_enough(measurements: list[Measurement], half_width: float) -> bool:
    """Whether every drivetrain ratio's 95 % interval is within ``half_width`` of its estimate (log scale)."""
    gated = [
        m for m in measurements if m.key.split("/")[2].split("@")[0] in DRIVETRAIN and m.key.endswith("/cpu")
    ]
    for measurement in gated:
        interval = measurement.interval
        if interval is None or interval.low is None or interval.high is None:
            return False
        if (math.log(interval.high) - math.log(interval.low)) / 2 > half_width:
            return False
    return True


def run(context: Context) -> CaseResult:
    result = CaseResult(
        name="ab",
        title="In-process A/B: per-step overhead",
        description=(
            "All variants of a table in one process, 1 intra-op thread, advancing in turns of a few optimizer "
            "steps (order from a balanced Latin square), after warm-up steps; several processes per drivetrain "
            "tree. Ratio = block time over raw's block time in the same round; the targets use the process "
            f"CPU clock. Final losses must match raw's within rel. {LOSS_REL_TOL:g}."
        ),
    )
    runner = context.runner(threads=1, timeout_s=600)
    try:
        for part in PARTS:
            _run_part(context, runner, part, result)
    finally:
        runner.close()
    if context.peers_python is None:
        result.notes.append("Peers left out (--no-peers).")
    return result


def _run_part(context: Context, runner: Runner, part: Part, result: CaseResult) -> None:
    plan = groups(context, part)
    if all(set(chosen) <= {"raw"} for _, chosen in plan):
        context.log(f"ab/{part.model}: no variant of this table chosen (--only); skipped")
        return
    sizing = plan_for(context, len(plan), part)
    python = context.peers_python if part.with_peers and context.peers_python else context.python
    context.log(
        f"ab/{part.model}: {len(plan)} group(s), {sizing.min_processes}–{sizing.max_processes} process(es) each "
        f"× {sizing.rounds} rounds of {sizing.block_steps}-step blocks"
    )
    samples: dict[str, list[Sample]] = {}
    started = time.monotonic()
    processes = 0
    while processes < sizing.max_processes:
        for source, chosen in plan:
            sample = runner.run_once(_process(python, source, chosen, part, sizing, processes), {}, processes)
            context.log(
                f"  process {processes + 1}{source.suffix}: "
                f"{'ok' if sample.error is None else 'FAILED'} ({sample.wall_s:.1f} s)"
            )
            samples.setdefault(_sample_name(part, source), []).append(sample)
        processes += 1
        if processes < sizing.min_processes:
            continue
        so_far = [
            m
            for source, chosen in plan
            for m in _measurements(_good(samples, part, source), chosen, source, part, sizing.block_steps)
        ]
        if precise_enough(so_far, sizing.half_width) or time.monotonic() - started > sizing.budget_s:
            break

    more = ""
    if sizing.max_processes > sizing.min_processes:
        more = (
            f" (from {sizing.min_processes}, more are added, up to {sizing.max_processes}, until every drivetrain "
            f"ratio is known within ±{sizing.half_width:.1%})"
        )
    rows = []
    measured: list[Measurement] = []
    for source, chosen in plan:
        runs = samples.get(_sample_name(part, source), [])
        failed = [s.error for s in runs if s.error is not None]
        if failed:
            result.problems.append(f"A/B process ({part.model}){source.suffix} failed: {failed[0]}")
        good = _good(samples, part, source)
        result.problems += check_processes(good, chosen, source)
        measurements = _measurements(good, chosen, source, part, sizing.block_steps)
        measured += measurements
        rows += _rows(good, chosen, source, measurements, part, sizing.block_steps)
    result.measurements += measured
    if not context.quick and not precise_enough(measured, part.warn_width):
        result.warnings.append(
            f"A/B ({part.title}): some drivetrain ratios are known only to worse than ±{part.warn_width:.1%} after "
            f"{processes} process(es) (a busy machine): rerun on a quiet one, or with more --rounds"
        )
    header = ["variant", "CPU time per step", "× raw, CPU [95 %]", "wall time per step", "× raw, wall [95 %]"]
    title = (
        f"{part.title}: {sizing.rounds} rounds of {sizing.block_steps}-step blocks per process after "
        f"{part.warmup_steps} warm-up steps, {processes} process(es) per drivetrain tree{more}"
    )
    result.tables.append(Table(title, header, rows))
    result.data[part.model] = {
        "block_steps": sizing.block_steps,
        "warmup_steps": part.warmup_steps,
        "rounds_per_process": sizing.rounds,
        "processes": processes,
        "samples": {
            name: [s.result if s.result is not None else {"error": s.error} for s in runs]
            for name, runs in samples.items()
        },
    }


def _sample_name(part: Part, source: Source) -> str:
    return f"ab{'' if part.model == 'tiny' else '-' + part.model}{source.suffix}"


def _process(
    python: str, source: Source, chosen: dict[str, Any], part: Part, sizing: Plan, index: int
) -> Variant:
    """One A/B process of a group: its settings travel in the variant's config."""
    # Checked against the imported drivetrain only when the process imports one.
    measured = source if any(n in DRIVETRAIN for n in chosen) else None
    config = {
        **part.settings,
        "variants": chosen,
        "rounds": sizing.rounds,
        "block_steps": sizing.block_steps,
        "warmup_steps": part.warmup_steps,
        "process_index": index,
        "timed_steps": 0,
    }
    name = _sample_name(part, source)
    return Variant(
        name, f"A/B process ({part.model})", (python, str(PROGRAM)), config=config, source=measured
    )


def _good(samples: dict[str, list[Sample]], part: Part, source: Source) -> list[dict[str, Any]]:
    return [s.result for s in samples.get(_sample_name(part, source), []) if s.result is not None]


def _names(chosen: dict[str, Any], source: Source) -> dict[str, str]:
    """Variant name in the program -> name in the report (drivetrain ones carry the tree)."""
    return {n: (n + source.suffix if n in DRIVETRAIN else n) for n in chosen}


def check_processes(
    results: list[dict[str, Any]], chosen: dict[str, Any], source: Source, rel_tol: float = LOSS_REL_TOL
) -> list[str]:
    """Every variant of every process took the planned steps and ended at raw's final loss."""
    problems = []
    for index, result in enumerate(results):
        variants = result["variants"]
        for name, entry in variants.items():
            if entry.get("error"):
                problems.append(f"A/B{source.suffix} process {index}: {name} failed: {entry['error']}")
            elif entry["steps"] != result["expected_steps"]:
                problems.append(
                    f"A/B{source.suffix} process {index}: {name} took {entry['steps']} optimizer steps, "
                    f"expected {result['expected_steps']}"
                )
        losses = {n: [e.get("final_loss")] for n, e in variants.items() if not e.get("error")}
        if "raw" in losses:
            problems += [
                f"A/B{source.suffix} process {index}: {p}"
                for p in check_same_loss(losses, "raw", rel_tol=rel_tol)
            ]
    return problems


def _measurements(
    results: list[dict[str, Any]], chosen: dict[str, Any], source: Source, part: Part, block_steps: int
) -> list[Measurement]:
    found = []
    for name, shown in _names(chosen, source).items():
        if name == "raw":
            continue
        for clock in ("cpu", "wall"):
            groups = [
                paired_log_ratios(r["variants"][name][f"{clock}_s"], r["variants"]["raw"][f"{clock}_s"])
                for r in results
                if not r["variants"][name].get("error") and not r["variants"]["raw"].get("error")
            ]
            label = f"{LABELS[name]}{source.label_suffix}, {part.model} MLP (in-process A/B, {CLOCKS[clock]})"
            limit = part.limits.get(name) if clock == "cpu" else None
            key = f"ab/{part.model}/{shown}/{clock}"
            found.append(Measurement(key, label, Scale.RATIO, "× raw", groups, limit))
    return found


def _rows(
    results: list[dict[str, Any]],
    chosen: dict[str, Any],
    source: Source,
    measurements: list[Measurement],
    part: Part,
    block_steps: int,
) -> list[list[str]]:
    by_key = {m.key: m for m in measurements}
    rows = []
    for name, shown in _names(chosen, source).items():
        label = LABELS[name] + (source.label_suffix if name in DRIVETRAIN or name == "raw" else "")
        per_step = {clock: per_step_time(results, name, clock, block_steps) for clock in ("cpu", "wall")}
        if name == "raw":
            rows.append([label, fmt_seconds(per_step["cpu"]), "1", fmt_seconds(per_step["wall"]), "1"])
            continue
        rows.append(
            [
                label,
                fmt_seconds(per_step["cpu"]),
                fmt_measurement(by_key.get(f"ab/{part.model}/{shown}/cpu")),
                fmt_seconds(per_step["wall"]),
                fmt_measurement(by_key.get(f"ab/{part.model}/{shown}/wall")),
            ]
        )
    return rows


def per_step_time(results: list[dict[str, Any]], name: str, clock: str, block_steps: int) -> float | None:
    """Median block time over all processes, per step."""
    blocks = sorted(b for r in results for b in r["variants"].get(name, {}).get(f"{clock}_s", []))
    return blocks[len(blocks) // 2] / block_steps if blocks else None
