# ruff: noqa: RUF001 (tables and messages use typographic signs on purpose)
"""Case 1: time per training step in one CPU process, overhead-bound and compute-bound.

Every variant trains the same MLP on the same data with the same DataLoader settings, seed,
optimizer and number of steps; they differ only in the framework around the loop. The scripts in
this folder are also the DDP case's scripts (``devices`` in the config, or run under a launcher).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.harness import Context, Sample, Variant
from benchmarks.intervals import Measurement
from benchmarks.report import CaseResult, Table, fmt_measurement, fmt_summary
from benchmarks.training import VariantStats, analyse, ratio_measurement, raw_samples

SCRIPTS = Path(__file__).resolve().parent

# Single process, fp32, same operations in the same order: the weights must come out bit-identical;
# the tolerance only absorbs printing round-trips.
LOSS_REL_TOL = 1e-6

# (model, warm-up steps, timed steps, batch size, learning rate, rounds) for full and quick runs.
# Rounds (README, "How many rounds"): fresh processes of one program differ by several percent
# (on an idle machine the wide MLP's per-process mean ranged 17.2 to 20.7 ms, its paired log ratios
# to raw up to ±12 %), so no affordable number of rounds resolves the wide MLP's 0.5 % limit; both
# MLPs' targets are decided by the in-process A/B case. These rounds give command-to-first-step,
# memory, the peers' wide-MLP rows and a second, wider view; 2 rounds each (the fewest that give
# an interval; 3 and 4 before, ~75 s more) pay for the A/B case's wide table and the DDP case's
# A/B and first-step rounds.
SETTINGS = {
    "tiny": {"full": (100, 800, 64, 0.05, 2), "quick": (50, 300, 64, 0.05, 1)},
    "wide": {"full": (5, 40, 64, 0.01, 2), "quick": (3, 15, 64, 0.01, 1)},
}
# Targets decided here: none (the A/B case decides them); kept as a table for a case that may get one.
LIMITS: dict[str, dict[str, float]] = {}

TITLES = {
    "tiny": "tiny MLP 32→64→1 (overhead-bound)",
    "wide": "wide MLP 256→2048→2048→1 (compute-bound)",
}


def variants(context: Context, *, with_logging: bool) -> list[Variant]:
    """Raw PyTorch first (the reference), then drivetrain, then the peers (if their venv is there)."""

    def own(name: str, label: str, script: str, **config: object) -> Variant:
        return Variant(name, label, (context.python, str(SCRIPTS / script)), config=config)

    def peer(name: str, label: str, script: str, **config: object) -> Variant:
        assert context.peers_python is not None
        return Variant(name, label, (context.peers_python, str(SCRIPTS / script)), config=config)

    drivetrain = [own("drivetrain_trainer", "drivetrain Trainer", "drivetrain_trainer.py")]
    if with_logging:
        drivetrain.append(
            own(
                "drivetrain_trainer_log",
                "drivetrain Trainer + self.log",
                "drivetrain_trainer.py",
                log_metric=True,
            )
        )
    drivetrain.append(own("drivetrain_accelerator", "drivetrain Accelerator", "drivetrain_accelerator.py"))
    chosen = [own("raw", "raw PyTorch", "raw.py")]
    chosen += [copy for variant in drivetrain for copy in context.per_source(variant)]
    if context.peers_python is not None:
        chosen.append(peer("lightning_trainer", "Lightning Trainer", "lightning_trainer.py"))
        if with_logging:
            chosen.append(
                peer(
                    "lightning_trainer_log",
                    "Lightning Trainer + self.log",
                    "lightning_trainer.py",
                    log_metric=True,
                )
            )
        chosen += [
            peer("fabric", "Lightning Fabric", "fabric.py"),
            peer("accelerate_loop", "HF Accelerate", "accelerate_loop.py"),
        ]
    return chosen


def run(context: Context) -> CaseResult:
    result = CaseResult(
        name="step_time",
        title="1. Step time, one CPU process",
        description=(
            f"Per-step time = mean interval between optimizer-step ends after the warm-up steps, "
            f"one fresh process per sample, variants interleaved. SGD, MSE loss, DataLoader(batch_size=64, "
            f"shuffle=False, num_workers=0), {context.cores} threads. All variants must reach the raw loop's "
            f"final loss within rel. {LOSS_REL_TOL:g}."
        ),
    )
    runner = context.runner(threads=context.cores)
    try:
        for model in ("tiny", "wide"):
            warmup, timed, batch, lr, rounds = SETTINGS[model]["quick" if context.quick else "full"]
            rounds = context.rounds or rounds
            config = {
                "model": model,
                "warmup_steps": warmup,
                "timed_steps": timed,
                "batch_size": batch,
                "lr": lr,
            }
            config["seed"] = 0
            chosen = context.select(variants(context, with_logging=model == "tiny"), "raw")
            context.log(
                f"step_time/{model}: {len(chosen)} variants × {rounds} rounds, {warmup}+{timed} steps"
            )
            samples = runner.interleave(chosen, config, rounds=rounds)
            stats, problems = analyse(
                chosen, samples, reference="raw", expected_steps=warmup + timed, rel_tol=LOSS_REL_TOL
            )
            result.problems += [f"[{model}] {p}" for p in problems]
            measurements = _measurements(model, chosen, samples, stats)
            result.measurements += measurements
            result.tables.append(
                _table(f"{TITLES[model]}: {warmup}+{timed} steps, {rounds} rounds", stats, measurements)
            )
            result.data[model] = {
                "config": config,
                "rounds": rounds,
                "variants": {n: s.as_dict() for n, s in stats.items()},
                "samples": raw_samples(samples),
            }
    finally:
        runner.close()
    if context.peers_python is None:
        result.notes.append("Peers left out (--no-peers).")
    return result


def _measurements(
    model: str, chosen: list[Variant], samples: dict[str, list[Sample]], stats: dict[str, VariantStats]
) -> list[Measurement]:
    limits = LIMITS.get(model, {})
    return [
        ratio_measurement(
            f"step_time/{model}/{variant.name}/step_s",
            f"{variant.label}, {TITLES[model]}",
            samples,
            variant.name,
            "raw",
            "step_s",
            limit=limits.get(variant.name.split("@")[0]),
        )
        for variant in chosen
        if variant.name != "raw" and stats[variant.name].error is None
    ]


def _table(title: str, stats: dict[str, VariantStats], measurements: list[Measurement]) -> Table:
    ratios = {m.key.split("/")[2]: m for m in measurements}
    rows = []
    for item in stats.values():
        if item.error is not None:
            rows.append([item.label, "FAILED: " + item.error.splitlines()[0], "", "", "", "", ""])
            continue
        rows.append(
            [
                item.label,
                fmt_summary(item["step_s"]),
                "1" if item.name == "raw" else fmt_measurement(ratios.get(item.name)),
                fmt_summary(item["step_median_s"]),
                fmt_summary(item["first_step_s"]),
                fmt_summary(item["max_rss_mib"], "MiB"),
                f"{item['final_loss'].median:.6g}" if item["final_loss"] else "—",
            ]
        )
    header = [
        "variant",
        "step time",
        "× raw [95 %]",
        "median step interval",
        "command → first step",
        "max RSS",
        "final loss",
    ]
    return Table(title, header, rows)
