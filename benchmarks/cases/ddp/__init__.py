# ruff: noqa: RUF001, RUF002, RUF003 (tables, messages and comments use typographic signs on purpose)
"""Case 3: DDP with 2 CPU processes, each framework started the way its users start it.

Raw PyTorch runs under ``torchrun --standalone``; drivetrain's Trainer and Lightning's Trainer and
Fabric launch their own second process (``python script.py`` with ``devices=2``); drivetrain's
Accelerator runs under ``drivetrain launch -n 2`` and Accelerate's under ``accelerate launch``.
The scripts are the step-time case's, which switch to DDP under a launcher or with ``devices=2``.

Two parts. The steady DDP step (target: each door ≤ 1.02× raw) comes from the in-process A/B
(``ab.py``): raw DDP and both doors in the same 2 processes, in alternating blocks. Command to
first step (target: ≤ raw torchrun + 0.1 s; from the moment the harness starts the command to the
end of rank 0's first optimizer step, so interpreter start, imports, launch, rendezvous and the DDP
wrap all count) needs fresh launches: raw and the two doors take more rounds than the peers, which
have no target. The fresh launches' steady step is shown too, without a target.
"""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks.cases.ddp.ab import run_ab
from benchmarks.cases.step_time import SCRIPTS
from benchmarks.harness import Context, Sample, Variant
from benchmarks.intervals import Measurement
from benchmarks.report import CaseResult, Table, fmt_measurement, fmt_summary
from benchmarks.training import VariantStats, analyse, difference_measurement, ratio_measurement, raw_samples

PROCESSES = 2
# Gradients are averaged over the same rows in every variant, but the all-reduce may add them in
# another order than a framework's own reduction: allow float rounding, nothing more.
LOSS_REL_TOL = 1e-5
FIRST_STEP_LIMIT_S = 0.1
# Sizing (README, "How many rounds"). A fresh launch is ~4.3 s to the first step (interpreter,
# `import torch` in the launcher and again in the ranks, rendezvous) plus 50 steps; its first-step
# time varies by ~100 ms (the idle runs of 2026-11-27: paired differences to raw with σ of
# 120–180 ms, bytecode compilation included), mostly two `import torch` in sequence. The half-width
# of n paired rounds is about 2.2·σ/√n with the small-sample expansion on top (×1.3 at n = 8):
# ±30 ms at σ = 100 ms would take ~60 rounds, 17 minutes for this part alone. So raw and the two
# doors run at least MIN_ROUNDS rounds, then more until both doors' differences are known within
# ±FIRST_STEP_HALF_WIDTH or MAX_ROUNDS rounds are done (~17 s a round on the idle AMD machine):
# about ±110 ms at σ = 100 ms, ±30 ms only where the machine's launches vary by ~25 ms. The peers
# have no target: PEER_ROUNDS. (The suite's 10–11 minutes leave ~2 minutes for this part.)
MIN_ROUNDS = 5
MAX_ROUNDS = 7
PEER_ROUNDS = 2
FIRST_STEP_HALF_WIDTH = 0.03
TARGETED = ("raw_torchrun", "drivetrain_trainer", "drivetrain_accelerator")


def variants(context: Context) -> list[Variant]:
    def script(name: str) -> str:
        return str(Path(SCRIPTS) / name)

    python, peers = context.python, context.peers_python
    n = str(PROCESSES)
    chosen = [
        Variant(
            "raw_torchrun",
            "raw PyTorch DDP, torchrun",
            (
                python,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={n}",
                script("raw.py"),
            ),
        ),
    ]
    drivetrain = [
        Variant(
            "drivetrain_trainer",
            "drivetrain Trainer(devices=2), python script.py",
            (python, script("drivetrain_trainer.py")),
            config={"devices": PROCESSES},
        ),
        Variant(
            "drivetrain_accelerator",
            "drivetrain Accelerator, drivetrain launch -n 2",
            (python, "-m", "drivetrain", "launch", "-n", n, script("drivetrain_accelerator.py")),
        ),
    ]
    chosen += [copy for variant in drivetrain for copy in context.per_source(variant)]
    if peers is not None:
        chosen += [
            Variant(
                "lightning_trainer",
                "Lightning Trainer(devices=2), python script.py",
                (peers, script("lightning_trainer.py")),
                config={"devices": PROCESSES},
            ),
            Variant(
                "fabric",
                "Lightning Fabric(devices=2), python script.py",
                (peers, script("fabric.py")),
                config={"devices": PROCESSES},
            ),
            Variant(
                "accelerate_loop",
                "HF Accelerate, accelerate launch",
                (
                    peers,
                    "-m",
                    "accelerate.commands.launch",
                    "--multi_gpu",  # with Accelerator(cpu=True): N CPU processes (`--cpu` starts one)
                    "--num_processes",
                    n,
                    "--num_machines",
                    "1",
                    "--mixed_precision",
                    "no",
                    "--dynamo_backend",
                    "no",
                    script("accelerate_loop.py"),
                ),
            ),
        ]
    return chosen


def run(context: Context) -> CaseResult:
    warmup, timed, rounds = (10, 50, 1) if context.quick else (10, 40, MAX_ROUNDS)
    rounds = context.rounds or rounds
    threads = max(1, context.cores // PROCESSES)
    config = {
        "model": "ddp",
        "warmup_steps": warmup,
        "timed_steps": timed,
        "batch_size": 32,
        "lr": 0.05,
        "seed": 0,
        "world_size": PROCESSES,
    }
    result = CaseResult(
        name="ddp",
        title=f"3. DDP, {PROCESSES} CPU processes (gloo)",
        description=(
            f"MLP 64→512→512→1, batch 32 per process, OMP_NUM_THREADS={threads} in every process. Steady step: "
            f"in-process A/B of raw DDP and drivetrain's doors (first table; the targets). Command → first step: "
            f"wall time from starting the command to the end of rank 0's first optimizer step, fresh launches of "
            f"{warmup}+{timed} steps (second table). All variants must reach the raw run's final loss within "
            f"rel. {LOSS_REL_TOL:g}."
        ),
    )
    run_ab(context, result, {k: v for k, v in config.items() if k not in ("warmup_steps", "timed_steps")})

    chosen = context.select(variants(context), "raw_torchrun")
    peer_rounds = min(rounds, PEER_ROUNDS) if not context.quick and context.rounds is None else rounds
    rounds_of = {v.name: peer_rounds for v in chosen if v.name.split("@")[0] not in TARGETED}
    least = rounds if context.quick or context.rounds is not None else MIN_ROUNDS
    context.log(f"ddp: {len(chosen)} variants, {least}–{rounds} rounds (peers {peer_rounds})")
    runner = context.runner(threads=threads, timeout_s=180)

    def enough(samples: dict[str, list[Sample]]) -> bool:
        found = [
            difference_measurement(
                f"ddp/2proc/{v.name}/first_step_s", "", samples, v.name, "raw_torchrun", "first_step_s"
            )
            for v in chosen
            if v.name.split("@")[0] in TARGETED[1:]
        ]
        return all(_half_width(m) <= FIRST_STEP_HALF_WIDTH for m in found)

    try:
        samples = runner.interleave(
            chosen, config, rounds=rounds, rounds_of=rounds_of, min_rounds=least, enough=enough
        )
    finally:
        runner.close()
    stats, problems = analyse(
        chosen, samples, reference="raw_torchrun", expected_steps=warmup + timed, rel_tol=LOSS_REL_TOL
    )
    result.problems += problems
    result.measurements += _measurements(chosen, samples, stats)
    done = max((len(s) for s in samples.values()), default=0)
    adaptive = f" (from {least}, up to {rounds}, until known within ±{FIRST_STEP_HALF_WIDTH * 1000:.0f} ms)"
    peers = [v for v in chosen if v.name in rounds_of]
    title = (
        f"Fresh launches: command → first step, {done} round(s) for raw and drivetrain"
        f"{adaptive if least < rounds else ''}"
        f"{f', {min(peer_rounds, done)} for the peers' if peers else ''}; steady step over {timed} steps, no target"
    )
    result.tables.append(_table(stats, result.measurements, title))
    result.data.update(
        {
            "config": config,
            "rounds": done,
            "peer_rounds": min(peer_rounds, done),
            "threads_per_process": threads,
            "variants": {n: s.as_dict() for n, s in stats.items()},
            "samples": raw_samples(samples),
        }
    )
    if context.peers_python is None:
        result.notes.append("Peers left out (--no-peers).")
    return result


def _half_width(measurement: Measurement) -> float:
    interval = measurement.interval
    if interval is None or interval.low is None or interval.high is None:
        return math.inf
    return (interval.high - interval.low) / 2


def _measurements(
    chosen: list[Variant], samples: dict[str, list[Sample]], stats: dict[str, VariantStats]
) -> list[Measurement]:
    measurements = []
    for variant in chosen:
        if variant.name == "raw_torchrun" or stats[variant.name].error is not None:
            continue
        targeted = variant.name.split("@")[0] in ("drivetrain_trainer", "drivetrain_accelerator")
        measurements.append(
            difference_measurement(
                f"ddp/2proc/{variant.name}/first_step_s",
                f"{variant.label}: command → first step",
                samples,
                variant.name,
                "raw_torchrun",
                "first_step_s",
                limit=FIRST_STEP_LIMIT_S if targeted else None,
            )
        )
        measurements.append(
            ratio_measurement(
                f"ddp/2proc/{variant.name}/step_s",
                f"{variant.label}: steady DDP step",
                samples,
                variant.name,
                "raw_torchrun",
                "step_s",
                reference_label="raw torchrun",
            )
        )
    return measurements


def _table(stats: dict[str, VariantStats], measurements: list[Measurement], title: str) -> Table:
    found = {m.key: m for m in measurements}
    rows = []
    for item in stats.values():
        if item.error is not None:
            rows.append([item.label, "FAILED: " + item.error.splitlines()[0], "", "", "", "", ""])
            continue
        reference = item.name == "raw_torchrun"
        rows.append(
            [
                item.label,
                fmt_summary(item["first_step_s"]),
                "0"
                if reference
                else fmt_measurement(found.get(f"ddp/2proc/{item.name}/first_step_s"), signed=True),
                fmt_summary(item["step_s"]),
                "1" if reference else fmt_measurement(found.get(f"ddp/2proc/{item.name}/step_s")),
                fmt_summary(item["max_rss_mib"], "MiB"),
                f"{item['final_loss'].median:.6g}" if item["final_loss"] else "—",
            ]
        )
    header = [
        "variant, launch",
        "command → first step",
        "vs raw [95 %]",
        "steady step",
        "× raw [95 %]",
        "max RSS rank 0",
        "final loss",
    ]
    return Table(title, header, rows)
