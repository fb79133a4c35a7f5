# ruff: noqa: RUF001, RUF003 (tables and messages use typographic signs on purpose)
"""The GPU check's training tables: which variants, what they are compared with, and the rendering.

Each table runs as one process of ``cases/gpu/ab_program.py`` (every variant built once, taking
turns in blocks of optimizer steps, the time taken after the GPU has finished each block), so a
paired round costs seconds, not a fresh process with its start-up and compilation per sample.
One round gives one step-time ratio per comparison; the rounds give the 20 % trimmed mean and its
95 % bootstrap interval (:mod:`benchmarks.intervals`), and a comparison with a limit is a target,
met, missed or undecided as everywhere in the suite.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.cases import gpt
from benchmarks.intervals import Measurement, Scale, paired_log_ratios
from benchmarks.report import CaseResult, Table, decision_mark, fmt_limit, fmt_measurement, fmt_seconds
from benchmarks.stats import check_same_loss

#: Relative tolerance between final losses of one loss group on a GPU: bf16 and non-deterministic
#: kernels make equal trainings drift apart (two raw runs of the 111 M GPT ended 4.5 % apart after
#: 48 steps on an H100); float8 against bf16 is held to the same bound. A dry run on the CPU is
#: deterministic: the same training gives the same loss to rounding.
GPU_LOSS_REL_TOL = 0.1
DRY_LOSS_REL_TOL = 1e-3
#: "our ratios ≥ 0.99× raw" (tokens/s), as a limit on the step-time ratio.
DOOR_LIMIT = 1 / 0.99


@dataclass(frozen=True)
class VariantSpec:
    name: str
    label: str
    script: str
    config: Mapping[str, Any] = field(default_factory=dict)
    peers: bool = False  # needs lightning or accelerate in the interpreter


@dataclass(frozen=True)
class Comparison:
    """Step time of ``variant`` over ``reference``'s, round by round; a target when ``limit`` is set."""

    variant: str
    reference: str
    label: str
    limit: float | None = None


@dataclass(frozen=True)
class TableSpec:
    """One table: its variants, loss groups and comparisons; rounds, block and warm-up steps (GPU, dry run)."""

    name: str
    title: str
    description: str
    size: str
    variants: tuple[VariantSpec, ...]
    reference: str
    comparisons: tuple[Comparison, ...]
    loss_groups: tuple[tuple[str, ...], ...]
    rounds: int
    block_steps: int
    warmup_steps: int
    cap_s: float
    host_time: bool = False  # show the host's CPU time per step (the launch-bound table)
    #: Loss groups across precisions (float8 against bf16): held to the GPU tolerance even in a dry run.
    cross_precision: tuple[tuple[str, ...], ...] = ()

    def settings(self, dry: bool) -> tuple[int, int, int]:
        """(rounds, block steps, warm-up steps): at least 3 rounds, the fewest that give an interval."""
        return (3, 2, 1) if dry else (self.rounds, self.block_steps, self.warmup_steps)


def _doors(compiled: bool) -> tuple[VariantSpec, ...]:
    suffix, config = (" + compile", {"compile": True}) if compiled else ("", {})
    return (
        VariantSpec("raw", "raw PyTorch" + suffix, "raw", config),
        VariantSpec("drivetrain_trainer", "drivetrain Trainer" + suffix, "drivetrain_trainer", config),
        VariantSpec(
            "drivetrain_accelerator", "drivetrain Accelerator" + suffix, "drivetrain_accelerator", config
        ),
        VariantSpec(
            "lightning_trainer", "Lightning Trainer" + suffix, "lightning_trainer", config, peers=True
        ),
        VariantSpec("accelerate_loop", "HF Accelerate" + suffix, "accelerate_loop", config, peers=True),
    )


def _door_comparisons(names: Sequence[str]) -> tuple[Comparison, ...]:
    labels = {
        "drivetrain_trainer": "drivetrain Trainer",
        "drivetrain_accelerator": "drivetrain Accelerator",
        "lightning_trainer": "Lightning Trainer",
        "accelerate_loop": "HF Accelerate",
    }
    return tuple(
        Comparison(name, "raw", labels[name], DOOR_LIMIT if name.startswith("drivetrain") else None)
        for name in names
        if name != "raw"
    )


_GPT = (
    "GPT decoder ({parameters}; {layers} layers, width {width}, {heads} heads, vocabulary {vocabulary}, "
    "context {context}, batch {batch}) on synthetic learnable tokens, AdamW, bf16 autocast with fp32 weights."
)

GPT_EAGER = TableSpec(
    name="gpt_eager",
    title="GPT benchmark, eager: front doors and peers",
    description=_GPT,
    size="gpt",
    variants=_doors(False),
    reference="raw",
    comparisons=_door_comparisons([v.name for v in _doors(False)]),
    loss_groups=(tuple(v.name for v in _doors(False)),),
    rounds=20,
    block_steps=5,
    warmup_steps=3,
    cap_s=40,
)
GPT_COMPILE = TableSpec(
    name="gpt_compile",
    title="GPT benchmark, torch.compile: front doors and peers",
    description=_GPT + " Every variant compiles its network with `module.compile()`.",
    size="gpt",
    variants=_doors(True),
    reference="raw",
    comparisons=_door_comparisons([v.name for v in _doors(True)]),
    loss_groups=(tuple(v.name for v in _doors(True)),),
    rounds=20,
    block_steps=5,
    warmup_steps=3,
    cap_s=80,
)
_FP8_VARIANTS = (
    VariantSpec("raw_bf16", "raw PyTorch, bf16 eager", "raw"),
    VariantSpec("raw_bf16_compile", "raw PyTorch, bf16 + compile", "raw", {"compile": True}),
    VariantSpec(
        "raw_fp8_compile", "raw PyTorch, torchao fp8 + compile", "raw", {"compile": True, "precision": "fp8"}
    ),
    VariantSpec(
        "trainer_bf16_compile", "drivetrain Trainer, bf16 + compile", "drivetrain_trainer", {"compile": True}
    ),
    VariantSpec(
        "trainer_fp8", 'drivetrain Trainer(precision="fp8")', "drivetrain_trainer", {"precision": "fp8"}
    ),
    VariantSpec(
        "trainer_fp8_layers",
        'drivetrain Trainer, Float8Precision(compile="layers")',
        "drivetrain_trainer",
        {"precision": "fp8", "fp8_compile": "layers"},
    ),
    VariantSpec(
        "accelerator_bf16_compile",
        "drivetrain Accelerator, bf16 + compile",
        "drivetrain_accelerator",
        {"compile": True},
    ),
    VariantSpec(
        "accelerator_fp8",
        'drivetrain Accelerator(mixed_precision="fp8")',
        "drivetrain_accelerator",
        {"precision": "fp8"},
    ),
)
FP8 = TableSpec(
    name="fp8",
    title="FP8 where it is meant to pay: a 4096-wide GPT",
    description=_GPT
    + " fp8: torchao float8 linear layers (tensorwise scaling) on the same layers in every variant (all but the "
    "first and last linear layer; all are large enough by torchao's size guidance). drivetrain's fp8 rows compile "
    'nothing themselves: `precision="fp8"` compiles the network (`compile="model"`, the default) or each '
    'float8 layer (`compile="layers"`). MFU is counted against the measured **bf16** matmul rate.',
    size="fp8",
    variants=_FP8_VARIANTS,
    reference="raw_bf16_compile",
    comparisons=(
        Comparison("raw_bf16", "raw_bf16_compile", "raw bf16 eager against raw bf16 + compile"),
        Comparison(
            "raw_fp8_compile", "raw_bf16_compile", "raw torchao fp8 + compile against raw bf16 + compile"
        ),
        Comparison(
            "trainer_fp8",
            "trainer_bf16_compile",
            "Trainer fp8 + compile against Trainer bf16 + compile (≥ 1.2× tokens/s)",
            1 / 1.2,
        ),
        Comparison(
            "accelerator_fp8",
            "accelerator_bf16_compile",
            "Accelerator fp8 + compile against Accelerator bf16 + compile (≥ 1.2× tokens/s)",
            1 / 1.2,
        ),
        Comparison("trainer_fp8", "raw_fp8_compile", "Trainer fp8 against raw torchao fp8 + compile", 1.02),
        Comparison(
            "accelerator_fp8", "raw_fp8_compile", "Accelerator fp8 against raw torchao fp8 + compile", 1.02
        ),
        Comparison(
            "trainer_fp8_layers", "trainer_fp8", 'Trainer fp8: compile="layers" against compile="model"'
        ),
        Comparison(
            "trainer_bf16_compile", "raw_bf16_compile", "Trainer bf16 + compile against raw", DOOR_LIMIT
        ),
        Comparison(
            "accelerator_bf16_compile",
            "raw_bf16_compile",
            "Accelerator bf16 + compile against raw",
            DOOR_LIMIT,
        ),
    ),
    loss_groups=(
        ("raw_bf16_compile", "raw_bf16", "trainer_bf16_compile", "accelerator_bf16_compile"),
        ("raw_fp8_compile", "trainer_fp8", "trainer_fp8_layers", "accelerator_fp8"),
    ),
    cross_precision=(("raw_bf16_compile", "raw_fp8_compile"),),
    rounds=12,
    block_steps=4,
    warmup_steps=3,
    cap_s=120,
)
OVERHEAD = TableSpec(
    name="overhead",
    title="Launch-bound: the 111 M GPT at batch 1, host overhead per step",
    description=_GPT
    + " At batch 1 a step is bound by the host launching kernels, so whatever a front door does per step "
    "shows; host CPU per step is the process CPU time of a block over its steps.",
    size="batch1",
    variants=_doors(False)[:3],
    reference="raw",
    comparisons=(
        Comparison("drivetrain_trainer", "raw", "drivetrain Trainer, batch 1", 1.02),
        Comparison("drivetrain_accelerator", "raw", "drivetrain Accelerator, batch 1", 1.02),
    ),
    loss_groups=(("raw", "drivetrain_trainer", "drivetrain_accelerator"),),
    rounds=30,
    block_steps=20,
    warmup_steps=5,
    cap_s=30,
    host_time=True,
)
TABLES = (GPT_EAGER, GPT_COMPILE, FP8, OVERHEAD)


def program_config(
    spec: TableSpec, *, dry: bool, peers: bool, seconds: float, record: str, hard_seconds: float | None = None
) -> dict[str, Any]:
    """``BENCH_CONFIG`` for the table's A/B program (the peers' variants only where they can run)."""
    rounds, block, warmup = spec.settings(dry)
    variants = {
        v.name: {"script": v.script, "config": dict(v.config)} for v in spec.variants if peers or not v.peers
    }
    return {
        "size": spec.size,
        "seed": 0,
        "lr": 6e-4,
        "dry_run": dry,
        "variants": variants,
        "rounds": rounds,
        "block_steps": block,
        "warmup_steps": warmup,
        "timed_steps": rounds * block,
        "seconds": seconds,
        "hard_seconds": hard_seconds,
        "record": record,
    }


@dataclass
class Blocks:
    """What a table's process measured: per variant, its (wall, CPU) block of each round it finished."""

    wall: dict[str, dict[int, float]] = field(default_factory=dict)
    cpu: dict[str, dict[int, float]] = field(default_factory=dict)

    @classmethod
    def from_outputs(cls, result: Mapping[str, Any] | None, records: Sequence[Mapping[str, Any]]) -> Blocks:
        blocks = cls()
        if result is not None:
            for name, entry in result["variants"].items():
                blocks.wall[name] = dict(enumerate(entry["wall_s"]))
                blocks.cpu[name] = dict(enumerate(entry["cpu_s"]))
            return blocks
        for line in records:  # the process was killed: the rounds it wrote down
            for name, (wall, cpu) in line["blocks"].items():
                blocks.wall.setdefault(name, {})[line["round"]] = wall
                blocks.cpu.setdefault(name, {})[line["round"]] = cpu
        return blocks

    def paired(self, name: str, reference: str) -> tuple[list[float], list[float]]:
        mine, theirs = self.wall.get(name, {}), self.wall.get(reference, {})
        rounds = sorted(set(mine) & set(theirs))
        return [mine[r] for r in rounds], [theirs[r] for r in rounds]


def analyse(
    spec: TableSpec,
    config: Mapping[str, Any],
    result: Mapping[str, Any] | None,
    records: Sequence[Mapping[str, Any]],
    error: str | None,
    peak_flops: float | None,
) -> CaseResult:
    """The table's :class:`CaseResult`: rows, comparisons (targets), fairness problems and notes."""
    dry = bool(config.get("dry_run"))
    layers, width, heads, vocabulary, context, batch = gpt.size(config)
    outcome = CaseResult(
        name=spec.name,
        title=spec.title + (" (CPU dry run)" if dry else ""),
        description=spec.description.format(
            parameters=parameters(config),
            layers=layers,
            width=width,
            heads=heads,
            vocabulary=vocabulary,
            context=context,
            batch=batch,
        ),
    )
    blocks = Blocks.from_outputs(result, records)
    ran = [v for v in spec.variants if v.name in config["variants"]]
    left_out = [v.label for v in spec.variants if v.name not in config["variants"]]
    if left_out:
        outcome.notes.append(
            f"Left out (lightning / accelerate not installed for this interpreter): {', '.join(left_out)}."
        )
    if error is not None:
        outcome.problems.append(f"{spec.name}: {error}")
    entries = result["variants"] if result is not None else {}
    for variant in ran:
        failed = entries.get(variant.name, {}).get("error")
        if failed:
            outcome.problems.append(f"{variant.name} failed: {failed}")
    tokens_per_step = gpt.tokens_per_step(config)
    flops = gpt.flops_per_token(config)
    measurements = {
        comparison: _comparison(spec, comparison, blocks)
        for comparison in spec.comparisons
        if comparison.variant in config["variants"] and comparison.reference in config["variants"]
    }
    outcome.measurements = list(measurements.values())
    rows = []
    for variant in ran:
        walls = list(blocks.wall.get(variant.name, {}).values())
        entry = entries.get(variant.name, {})
        if not walls:
            rows.append(
                [
                    variant.label,
                    "not measured: " + (entry.get("error") or error or "no round finished").splitlines()[0],
                ]
                + [""] * (5 + spec.host_time)
            )
            continue
        step = statistics.median(walls) / config["block_steps"]
        tokens = tokens_per_step / step
        to_reference = next(
            (
                m
                for c, m in measurements.items()
                if c.variant == variant.name and c.reference == spec.reference
            ),
            None,
        )
        row = [
            variant.label,
            f"{tokens:,.0f}",
            f"{tokens * flops / peak_flops:.1%}" if peak_flops else "—",
            fmt_seconds(step),
            "1" if variant.name == spec.reference else fmt_measurement(to_reference),
        ]
        if spec.host_time:
            cpu = list(blocks.cpu.get(variant.name, {}).values())
            row.append(fmt_seconds(statistics.median(cpu) / config["block_steps"]) if cpu else "—")
        loss = entry.get("final_loss")
        row.append(f"{loss:.5g}" if loss is not None else "—")
        rows.append(row)
    header = ["variant", "tokens/s", "MFU", "step time", f"× {_label(spec, spec.reference)} [95 %]"]
    header += ["host CPU per step"] if spec.host_time else []
    header += ["final loss"]
    outcome.tables.append(Table("", header, rows))
    if measurements:
        outcome.tables.append(
            Table(
                "Comparisons (step time, paired rounds)",
                ["comparison", "measured [95 %]", "rounds", "limit", "decision"],
                [
                    [
                        m.label,
                        fmt_measurement(m),
                        str(m.interval.units if m.interval else 0),
                        fmt_limit(m) if m.limit is not None else "—",
                        decision_mark(m.decision) if m.limit is not None else "",
                    ]
                    for m in measurements.values()
                ],
            )
        )
    outcome.problems += _fairness(spec, config, result, dry)
    rounds = min((len(blocks.wall.get(v.name, {})) for v in ran), default=0)
    planned = config["rounds"]
    if rounds < 3:
        outcome.problems.append(
            f"{spec.name}: {rounds} round(s) per variant, fewer than the 3 an interval needs (the time cap came first)"
        )
    outcome.notes.append(
        f"{rounds} of {planned} planned rounds of {config['block_steps']} steps per variant after {config['warmup_steps']} "
        f"warm-up steps, one process, variants in turns (Williams order)"
        + ("" if rounds >= planned else "; the time cap ended the rest")
        + (": fewer than 3 rounds give no interval." if rounds < 3 else ".")
    )
    if result is not None and result.get("gpu_max_allocated_gib"):
        outcome.notes.append(
            f"Peak GPU memory of the process (all variants resident): {result['gpu_max_allocated_gib']:.1f} GiB."
        )
    outcome.data = {"config": dict(config), "result": result, "records": list(records), "error": error}
    return outcome


def _comparison(spec: TableSpec, comparison: Comparison, blocks: Blocks) -> Measurement:
    values, references = blocks.paired(comparison.variant, comparison.reference)
    ratios = paired_log_ratios(values, references)
    return Measurement(
        f"gpu/{spec.name}/{comparison.variant}/{comparison.reference}/step_s",
        comparison.label,
        Scale.RATIO,
        f"× {_label(spec, comparison.reference)}",
        [ratios],
        comparison.limit,
    )


def _fairness(
    spec: TableSpec, config: Mapping[str, Any], result: Mapping[str, Any] | None, dry: bool
) -> list[str]:
    """Same steps for every variant; final losses of each loss group within the tolerance."""
    if result is None:
        return []
    problems = []
    entries = {n: e for n, e in result["variants"].items() if not e.get("error")}
    steps = {n: e["steps"] for n, e in entries.items()}
    if len(set(steps.values())) > 1:
        problems.append(f"{spec.name}: the variants took different numbers of steps: {steps}")
    elif (
        steps
        and not any(e.get("stopped") for e in entries.values())
        and set(steps.values()) != {result["expected_steps"]}
    ):
        problems.append(f"{spec.name}: the variants took {steps} steps, expected {result['expected_steps']}")
    groups = [(group, DRY_LOSS_REL_TOL if dry else GPU_LOSS_REL_TOL) for group in spec.loss_groups]
    groups += [(group, GPU_LOSS_REL_TOL) for group in spec.cross_precision]
    for group, tolerance in groups:
        losses = {n: [entries[n].get("final_loss")] for n in group if n in entries}
        if group[0] in losses and len(losses) > 1:
            problems += [f"{spec.name}: {p}" for p in check_same_loss(losses, group[0], rel_tol=tolerance)]
    return problems


def _label(spec: TableSpec, name: str) -> str:
    return next((v.label for v in spec.variants if v.name == name), name)


def parameters(config: Mapping[str, Any]) -> str:
    layers, width, _, vocabulary, context, _ = gpt.size(config)
    count = 12 * layers * width * width + vocabulary * width + context * width
    return f"{count / 1e6:.0f} M parameters" if count >= 1e6 else f"{count / 1e3:.0f} k parameters"


def mfu_note(peak_flops: float | None) -> str:
    if peak_flops is None:
        return "MFU not computed: no bf16 matmul rate measured (a dry run, or the ceiling part failed)."
    return (
        f"MFU = tokens/s × (6 · matmul parameters + 12 · layers · width · context) FLOPs per token over the "
        f"measured bf16 matmul rate ({peak_flops / 1e12:.0f} TFLOP/s)."
    )
