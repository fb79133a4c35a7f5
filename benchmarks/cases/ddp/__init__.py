# ruff: noqa: RUF001 (tables and messages use typographic signs on purpose)
"""Case 3: DDP with 2 CPU processes, each framework started the way its users start it.

Raw PyTorch runs under ``torchrun --standalone``; drivetrain's Trainer and Lightning's Trainer and
Fabric launch their own second process (``python script.py`` with ``devices=2``); drivetrain's
Accelerator runs under ``drivetrain launch -n 2`` and Accelerate's under ``accelerate launch``.
The scripts are the step-time case's, which switch to DDP under a launcher or with ``devices=2``.

Two numbers per variant: command-to-first-step (from the moment the harness starts the command to
the end of rank 0's first optimizer step, so interpreter start, imports, launch, rendezvous and
the DDP wrap all count) and the steady-state step time on rank 0 after the warm-up steps.
"""

from __future__ import annotations

from pathlib import Path

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
STEP_LIMIT = 1.02
# Each round costs ~6 s per variant (two interpreters, rendezvous, the DDP wrap); three rounds keep
# the case near two minutes. Its intervals are wide at that (see README, "How many rounds"):
# `--rounds 10` gives decisions where these are undecided.
ROUNDS = 3


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
    warmup, timed, rounds = (10, 50, 1) if context.quick else (20, 150, ROUNDS)
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
            f"MLP 64→512→512→1, batch 32 per process, {warmup}+{timed} steps, {rounds} round(s), "
            f"OMP_NUM_THREADS={threads} in every process. Command → first step: wall time from starting "
            f"the command to the end of rank 0's first optimizer step. Steady step: rank 0's mean step "
            f"after the warm-up. All variants must reach the raw run's final loss within rel. {LOSS_REL_TOL:g}."
        ),
    )
    chosen = context.select(variants(context), "raw_torchrun")
    context.log(f"ddp: {len(chosen)} variants × {rounds} rounds")
    runner = context.runner(threads=threads, timeout_s=180)
    try:
        samples = runner.interleave(chosen, config, rounds=rounds)
    finally:
        runner.close()
    stats, problems = analyse(
        chosen, samples, reference="raw_torchrun", expected_steps=warmup + timed, rel_tol=LOSS_REL_TOL
    )
    result.problems += problems
    result.measurements += _measurements(chosen, samples, stats)
    result.tables.append(_table(stats, result.measurements))
    result.data = {
        "config": config,
        "rounds": rounds,
        "threads_per_process": threads,
        "variants": {n: s.as_dict() for n, s in stats.items()},
        "samples": raw_samples(samples),
    }
    if context.peers_python is None:
        result.notes.append("Peers left out (--no-peers).")
    return result


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
                limit=STEP_LIMIT if targeted else None,
            )
        )
    return measurements


def _table(stats: dict[str, VariantStats], measurements: list[Measurement]) -> Table:
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
    return Table("", header, rows)
