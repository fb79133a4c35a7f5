# ruff: noqa: RUF001 (tables and messages use typographic signs on purpose)
"""Case 2: what importing each framework costs on top of ``import torch``, and ``drivetrain --help``.

Each sample is a fresh interpreter that times ``import torch`` and then the framework's import
statement; the reported cost is the second time (the framework's own modules, torch already
loaded), so the two interpreters' torch load times do not enter the comparison. The command
rows (``drivetrain --help``, ``--version``) import nothing first: their cost is everything the
command does over the interpreter's start, torch included if it imported torch (it must not:
the table says whether it did), against a limit of 1 s.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.harness import Context, Variant
from benchmarks.intervals import Measurement, Scale
from benchmarks.report import CaseResult, Table, fmt_measurement, fmt_summary
from benchmarks.stats import summarize
from benchmarks.training import by_round, raw_samples

SCRIPT = Path(__file__).resolve().parent / "measure.py"
# `from lightning.fabric import Fabric` is not listed: it runs `lightning/__init__`, which imports
# both Fabric and the Trainer, so it costs the same as `import lightning` (measured: 1.39 s vs 1.36 s).
LIMIT_S = 0.05
#: What ``drivetrain --help``/``--version`` may take over the interpreter's start (issue 24: 9 to 11 s
#: when they imported torch).
COMMAND_LIMIT_S = 1.0
# An import is a steady ~0.1 s with a spread of a few ms between fresh interpreters: five rounds
# put the interval within a few percent of the estimate, far narrower than any distance to the
# 50 ms limit that matters.
ROUNDS = 5

# (name, statement, interpreter: "own" or "peers")
STATEMENTS = (
    ("drivetrain", "import drivetrain", "own"),
    ("drivetrain_trainer", "from drivetrain import Trainer, TrainingModule", "own"),
    ("drivetrain_accelerator", "from drivetrain import Accelerator", "own"),
    ("lightning", "import lightning", "peers"),
    ("accelerate", "from accelerate import Accelerator", "peers"),
)


def _command(arguments: str) -> str:
    """A statement that runs ``drivetrain ARGUMENTS`` as the console script does (output discarded)."""
    return (
        "import contextlib, io\n"
        "from drivetrain.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        f"    main({arguments.split()!r})\n"
    )


# (name, shown as, statement): timed from the interpreter's start, nothing imported first.
COMMANDS = (
    ("drivetrain_help", "drivetrain --help", _command("--help")),
    ("drivetrain_version", "drivetrain --version", _command("--version")),
)


def run(context: Context) -> CaseResult:
    rounds, warmup = (1, 0) if context.quick else (ROUNDS, 1)
    rounds = context.rounds or rounds
    variants = []
    for name, statement, interpreter in STATEMENTS:
        python = context.python if interpreter == "own" else context.peers_python
        if python is None:
            continue
        variant = Variant(
            name, statement, (python, str(SCRIPT)), config={"statement": statement, "shown": statement}
        )
        variants += context.per_source(variant) if interpreter == "own" else [variant]
    for name, shown, statement in COMMANDS:
        config = {"statement": statement, "shown": shown, "torch_first": False}
        variants += context.per_source(Variant(name, shown, (context.python, str(SCRIPT)), config=config))
    variants = context.select(variants)
    result = CaseResult(
        name="import_time",
        title="2. Import time over torch",
        description=(
            f"Each sample is a fresh interpreter: time `import torch`, then the statement; the cost shown "
            f"is the statement's own time. The `drivetrain` commands import nothing first: their cost is the "
            f"whole command over the interpreter's start. {rounds} rounds after {warmup} warm-up round(s), "
            f"interleaved."
        ),
    )
    context.log(f"import_time: {len(variants)} statements × {rounds} rounds")
    runner = context.runner(threads=context.cores)
    try:
        samples = runner.interleave(variants, {}, rounds=rounds, warmup_rounds=warmup)
    finally:
        runner.close()
    rows = []
    summaries = {}
    for variant in variants:
        runs = samples[variant.name]
        suffix = variant.source.label_suffix if variant.source else ""
        error = next((s.error for s in runs if s.error), None)
        if error is not None:
            result.problems.append(f"{variant.name} failed: {error}")
            rows.append(
                [
                    f"`{variant.config['shown']}`{suffix}",
                    "FAILED: " + error.splitlines()[0],
                    "",
                    "",
                    "",
                    "",
                ]
            )
            summaries[variant.name] = None
            continue
        cost = summarize(s.get("import_s") for s in runs)
        torch_time = summarize(s.get("torch_s") for s in runs)
        rss = summarize(s.get("max_rss_mib") for s in runs)
        modules = summarize(s.get("modules") for s in runs)
        summaries[variant.name] = {"import_s": cost, "torch_s": torch_time, "max_rss_mib": rss}
        command = not variant.config.get("torch_first", True)
        if command and any(s.get("torch") for s in runs):
            result.problems.append(f"`{variant.config['shown']}` imported torch")
        measurement = Measurement(
            f"import_time/{variant.name}/import_s",
            f"`{variant.config['shown']}` over "
            + ("the interpreter's start" if command else "`import torch`")
            + suffix,
            Scale.LINEAR,
            "s",
            [[v] for v in by_round(runs, "import_s").values()],
            COMMAND_LIMIT_S if command else LIMIT_S if variant.name.startswith("drivetrain") else None,
        )
        result.measurements.append(measurement)
        rows.append(
            [
                f"`{variant.config['shown']}`{suffix}",
                fmt_measurement(measurement),
                fmt_summary(cost),
                ("imported it" if any(s.get("torch") for s in runs) else "not imported")
                if command
                else fmt_summary(torch_time),
                fmt_summary(rss, "MiB"),
                f"{modules.median:.0f}" if modules else "—",
            ]
        )
    header = [
        "statement",
        "cost over torch [95 %]",
        "median (min–max)",
        "`import torch` itself",
        "max RSS",
        "modules loaded",
    ]
    result.tables.append(Table("", header, rows))
    result.data = {
        "rounds": rounds,
        "variants": {
            n: ({k: v.as_dict() if v else None for k, v in s.items()} if s else None)
            for n, s in summaries.items()
        },
        "samples": raw_samples(samples),
    }
    return result
