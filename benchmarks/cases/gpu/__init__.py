# ruff: noqa: RUF001 (tables and messages use typographic signs on purpose)
"""Case 5: a ~110 M-parameter GPT on one CUDA GPU, bf16-mixed, eager and ``torch.compile``.

Tokens/s and MFU (model FLOPs per second over the card's measured bf16 matmul rate) for raw
PyTorch, drivetrain's two front doors, Lightning and Accelerate; then one-GPU DDP against FSDP2,
raw and through drivetrain's Trainer; then the Trainer with ``precision="fp8"`` (torchao float8
linear layers) against its bf16 row, where the GPU has float8 (compute capability 8.9+). Runs
only where CUDA is present; ``--gpu-dry-run`` runs the
same scripts on the CPU with a tiny model and a trace-only compile, to check the wiring (no MFU,
and its times mean nothing).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from benchmarks.harness import Context, Variant
from benchmarks.intervals import Measurement
from benchmarks.report import CaseResult, Table, fmt_measurement, fmt_summary
from benchmarks.stats import Summary
from benchmarks.training import VariantStats, analyse, ratio_measurement, raw_samples

SCRIPTS = Path(__file__).resolve().parent
# bf16 arithmetic and non-deterministic CUDA kernels (embedding and attention backward) make two
# runs of the same training drift apart, and early in training Adam amplifies the drift: on an
# H100, raw PyTorch and raw one-process DDP (the same arithmetic) ended 48 steps apart by 4.5%
# (8.49 vs 8.88, from ln V = 10.4). The tolerance is the smallest round figure above that; a
# variant that did not train, or took another number of steps (checked exactly), is caught.
GPU_LOSS_REL_TOL = 0.1
CPU_LOSS_REL_TOL = 1e-4
# Rounds per variant on a GPU: the fewest that give an interval (a percentile bootstrap over 2
# rounds can only repeat them). All 13 variants take ~7 min a round on an H100, so a 10-minute
# device call reaches 3 rounds only for a subset (README: "On a CUDA machine").
ROUNDS = 3

FRONT_DOORS = (
    ("raw", "raw PyTorch", "raw.py", "own"),
    ("drivetrain_trainer", "drivetrain Trainer", "drivetrain_trainer.py", "own"),
    ("drivetrain_accelerator", "drivetrain Accelerator", "drivetrain_accelerator.py", "own"),
    ("lightning_trainer", "Lightning Trainer", "lightning_trainer.py", "peers"),
    ("accelerate_loop", "HF Accelerate", "accelerate_loop.py", "peers"),
)


def cuda_available(python: str) -> bool:
    probe = subprocess.run(
        [python, "-c", "import torch; print(torch.cuda.is_available())"], capture_output=True, text=True
    )
    return probe.stdout.strip() == "True"


def float8_available(python: str) -> bool:
    """A GPU with float8 tensor cores (compute capability 8.9+) and torchao installed."""
    probe = subprocess.run(
        [
            python,
            "-c",
            "import torch, torchao; print(torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9))",
        ],
        capture_output=True,
        text=True,
    )
    return probe.stdout.strip() == "True"


def variants(context: Context) -> tuple[list[Variant], list[list[str]]]:
    """All variants in run order, and the loss groups (first member: the group's reference).

    The compiled runs go last: compiling is the slowest part of a run on a leased machine, and
    with ``--time-limit`` what is not reached is reported as not run.
    """

    def front_doors(compiled: bool) -> list[Variant]:
        suffix = " + compile" if compiled else ""
        chosen = []
        for name, label, script, interpreter in FRONT_DOORS:
            python = context.python if interpreter == "own" else context.peers_python
            if python is not None:
                command = (python, str(SCRIPTS / script))
                variant = Variant(
                    name + ("_compile" if compiled else ""), label + suffix, command, {"compile": compiled}
                )
                chosen += context.per_source(variant) if name.startswith("drivetrain") else [variant]
        return chosen

    torchrun = (context.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1")
    raw = str(SCRIPTS / "raw.py")
    parallel = [
        Variant("raw_ddp", "raw DDP (torchrun, 1 GPU)", (*torchrun, raw), {"parallel": "ddp"}),
        Variant("raw_fsdp", "raw FSDP2 (torchrun, 1 GPU)", (*torchrun, raw), {"parallel": "fsdp"}),
        *context.per_source(
            Variant(
                "drivetrain_fsdp",
                'drivetrain Trainer(strategy="fsdp")',
                (context.python, str(SCRIPTS / "drivetrain_trainer.py")),
                {"strategy": "fsdp"},
            )
        ),
    ]
    eager, compiled = front_doors(False), front_doors(True)
    # FP8 against the Trainer's bf16 row (the eager group's drivetrain_trainer).
    float8: list[Variant] = []
    if not context.gpu_dry_run and float8_available(context.python):
        float8 = context.per_source(
            Variant(
                "drivetrain_fp8",
                'drivetrain Trainer(precision="fp8")',
                (context.python, str(SCRIPTS / "drivetrain_trainer.py")),
                {"precision": "fp8"},
            )
        )
    groups = [[v.name for v in eager], [v.name for v in compiled], [v.name for v in parallel]]
    bf16_trainer = next((v.name for v in eager if v.name.startswith("drivetrain_trainer")), None)
    if float8 and bf16_trainer is not None:
        groups.append([bf16_trainer, *(v.name for v in float8)])
    return [*eager, *parallel, *float8, *compiled], groups


def run(context: Context) -> CaseResult:
    dry = context.gpu_dry_run
    result = CaseResult(
        name="gpu",
        title="5. GPU: GPT decoder, bf16-mixed" + (" (CPU dry run)" if dry else ""),
        description="",
    )
    if not dry and not cuda_available(context.python):
        result.skipped = "no CUDA GPU here (`--gpu-dry-run` runs the scripts on the CPU with a tiny model)."
        return result
    warmup, timed = (2, 4) if dry else (8, 40)
    rounds = context.rounds or (1 if dry or context.quick else ROUNDS)
    config = {"warmup_steps": warmup, "timed_steps": timed, "seed": 0, "lr": 6e-4, "dry_run": dry}
    rel_tol = CPU_LOSS_REL_TOL if dry else GPU_LOSS_REL_TOL
    runner = context.runner(threads=context.cores, timeout_s=240)
    try:
        ceiling = None
        if not dry:
            context.log("gpu: measuring the bf16 matmul ceiling")
            sample = runner.run_once(
                Variant("ceiling", "bf16 matmul", (context.python, str(SCRIPTS / "ceiling.py"))), {}
            )
            if sample.error is not None:
                result.problems.append(f"ceiling measurement failed: {sample.error}")
            else:
                ceiling = sample.result
                result.data["machine"] = {
                    "gpu": f"{ceiling['gpu']} (driver {ceiling.get('driver')}, CUDA {ceiling['cuda']}, "
                    f"torch {ceiling['torch']}, bf16 matmul {ceiling['tflops']:.0f} TFLOP/s measured)"
                }
        chosen, groups = variants(context)
        chosen = context.select(chosen, *(group[0] for group in groups))
        context.log(
            f"gpu: {len(chosen)} variants × {rounds} round(s), {warmup}+{timed} steps"
            + (" (dry run)" if dry else "")
        )
        samples = runner.interleave(chosen, config, rounds=rounds)
    finally:
        runner.close()
    stats, problems = analyse(
        chosen, samples, reference="raw", expected_steps=warmup + timed, rel_tol=rel_tol, loss_groups=groups
    )
    result.problems += problems
    peak = ceiling["tflops"] * 1e12 if ceiling else None
    _add_mfu(stats, samples, peak)
    result.description = _describe(config, ceiling, rel_tol, samples)
    titles = [
        "Front doors, eager",
        "Front doors, torch.compile",
        "One GPU: DDP vs FSDP2",
        "FP8 vs bf16 (Trainer)",
    ]
    for title, group in zip(titles, groups):
        measurements = _measurements(group, stats, samples)
        result.measurements += measurements
        result.tables.append(_table(title, stats, group, measurements))
    result.data.update(
        config=config,
        ceiling=ceiling,
        variants={n: s.as_dict() for n, s in stats.items()},
        samples=raw_samples(samples),
    )
    if context.peers_python is None:
        result.notes.append("Peers left out (--no-peers).")
    if rounds < 3:
        result.notes.append(
            f"{rounds} round(s) per variant: an interval needs 3 or more (README: 'On a CUDA machine')."
        )
    if len(groups) < 4 and not dry:
        result.notes.append(
            "No FP8 row: this GPU has no float8 (compute capability < 8.9) or torchao is missing."
        )
    elif not dry:
        result.notes.append(
            "FP8 row: torchao float8 linear layers (tensorwise recipe; first and last linear layers kept in bf16); "
            "its MFU is counted against the measured bf16 matmul rate, like the other rows."
        )
    result.notes.append(
        'No drivetrain DDP row: drivetrain refuses strategy="ddp" with one device (a one-process DDP '
        "would only add overhead); its single-device run is the eager drivetrain Trainer row."
    )
    return result


def _add_mfu(stats: dict[str, VariantStats], samples: dict[str, Any], peak: float | None) -> None:
    for name, item in stats.items():
        tokens = item["tokens_per_s"]
        runs = samples.get(name, [])
        if peak is None or tokens is None or not runs or runs[0].get("flops_per_token") is None:
            continue
        flops = runs[0].get("flops_per_token")
        item.summaries["mfu"] = Summary(
            tokens.median * flops / peak, tokens.low * flops / peak, tokens.high * flops / peak, tokens.count
        )


def _describe(
    config: dict[str, Any], ceiling: dict[str, Any] | None, rel_tol: float, samples: dict[str, Any]
) -> str:
    parameters = next(
        (s.get("parameters") for runs in samples.values() for s in runs if s.get("parameters")), None
    )
    size = f"{parameters / 1e6:.0f} M parameters" if parameters else "GPT"
    text = (
        f"GPT decoder ({size}; 12 layers, width 768, 12 heads, vocabulary 32768, context 1024, batch 16) "
        f"on synthetic learnable tokens, AdamW, bf16 autocast with fp32 weights, "
        f"{config['warmup_steps']}+{config['timed_steps']} steps. Tokens/s from the mean step time after the "
        f"warm-up steps (the clock waits for the GPU at both ends of the window). MFU = tokens/s × "
        f"6·(matmul parameters) + 12·layers·width·context FLOPs per token, over the measured bf16 matmul rate"
    )
    text += (
        f" ({ceiling['tflops']:.0f} TFLOP/s on this card)." if ceiling else " (not measured in a dry run)."
    )
    return (
        text
        + f" Final losses must agree within rel. {rel_tol:g} per table (bf16 and non-deterministic kernels make "
        "equal trainings drift apart early in training)."
    )


def _measurements(
    names: list[str], stats: dict[str, VariantStats], samples: dict[str, Any]
) -> list[Measurement]:
    """Step time of each variant of a table over the table's first (reference) variant, per round."""
    reference = names[0]
    return [
        ratio_measurement(
            f"gpu/{reference}/{name}/step_s",
            f"{stats[name].label}: step time",
            samples,
            name,
            reference,
            "step_s",
            reference_label=reference,
        )
        for name in names[1:]
        if name in stats and stats[name].error is None
    ]


def _table(
    title: str, stats: dict[str, VariantStats], names: list[str], measurements: list[Measurement]
) -> Table:
    reference = names[0]
    ratios = {m.key.split("/")[2]: m for m in measurements}
    rows = []
    for name in names:
        item = stats.get(name)
        if item is None:
            continue
        if item.error is not None:
            rows.append([item.label, "FAILED: " + item.error.splitlines()[0], "", "", "", "", "", ""])
            continue
        mfu = item["mfu"]
        tokens = item["tokens_per_s"]
        rows.append(
            [
                item.label,
                f"{tokens.median:,.0f}" if tokens else "—",
                f"{mfu.median:.1%}" if mfu else "—",
                fmt_summary(item["step_s"]),
                "1" if name == reference else fmt_measurement(ratios.get(name)),
                fmt_summary(item["first_step_s"]),
                f"{memory.median:.1f} GiB" if (memory := item["gpu_max_allocated_gib"]) else "—",
                f"{item['final_loss'].median:.5g}" if item["final_loss"] else "—",
            ]
        )
    header = [
        "variant",
        "tokens/s",
        "MFU",
        "step time",
        f"× {reference} [95 %]",
        "command → first step",
        "GPU memory",
        "final loss",
    ]
    return Table(title, header, rows)
