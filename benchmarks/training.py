# ruff: noqa: RUF001 (units use typographic signs on purpose)
"""Turns the samples of a training benchmark into summaries, fairness checks and table rows.

Shared by the cases whose scripts train (step time, DDP, GPU): each sample reports step times,
command-to-first-step, peak memory, step count and final loss (see ``cases/common.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.harness import Sample, Variant
from benchmarks.intervals import Measurement, Scale, paired_differences, paired_log_ratios
from benchmarks.stats import Summary, check_same_loss, check_step_counts, summarize

METRICS = (
    "step_s",
    "step_median_s",
    "first_step_s",
    "max_rss_mib",
    "final_loss",
    "tokens_per_s",
    "gpu_max_allocated_gib",
)


@dataclass
class VariantStats:
    """One variant's summaries (None where it reported nothing) and its error, if it failed."""

    name: str
    label: str
    summaries: dict[str, Summary | None] = field(default_factory=dict)
    error: str | None = None

    def __getitem__(self, metric: str) -> Summary | None:
        return self.summaries.get(metric)

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "error": self.error,
            **{k: (v.as_dict() if v else None) for k, v in self.summaries.items()},
        }


def analyse(
    variants: Sequence[Variant],
    samples: Mapping[str, Sequence[Sample]],
    *,
    reference: str,
    expected_steps: int,
    rel_tol: float,
    loss_groups: Sequence[Sequence[str]] | None = None,
) -> tuple[dict[str, VariantStats], list[str]]:
    """Summaries per variant, and the problems: failed variants, wrong step counts, unequal losses.

    Args:
        reference: the variant every other one is compared with (its loss is the expected one).
        expected_steps: optimizer steps every sample must have taken.
        rel_tol: how far a final loss may be from the reference's, relatively.
        loss_groups: variants whose losses must agree with the group's first member, when they
            cannot all agree with one reference (e.g. compiled and eager runs); default: all of them
            against ``reference``.
    """
    stats: dict[str, VariantStats] = {}
    problems: list[str] = []
    for variant in variants:
        runs = samples.get(variant.name, [])
        failed = next((s.error for s in runs if s.error is not None), None)
        stats[variant.name] = VariantStats(variant.name, variant.label, error=failed)
        if failed is not None:
            problems.append(f"{variant.name} failed: {failed}")
            continue
        stats[variant.name].summaries = {m: summarize(s.get(m) for s in runs) for m in METRICS}
    ok = {v.name: samples.get(v.name, []) for v in variants if stats[v.name].error is None}
    problems += check_step_counts(
        {n: [s.get("steps") for s in runs] for n, runs in ok.items()}, expected_steps
    )
    groups = loss_groups or [[reference, *[n for n in ok if n != reference]]]
    for group in groups:
        present = [n for n in group if n in ok]
        if not present or group[0] not in ok:
            continue
        losses = {n: [s.get("final_loss") for s in ok[n]] for n in present}
        problems += check_same_loss(losses, group[0], rel_tol=rel_tol)
    return stats, problems


def raw_samples(samples: Mapping[str, Sequence[Sample]]) -> dict[str, list[dict[str, Any]]]:
    """Every sample's own numbers, for the JSON file."""
    return {
        name: [
            {"round": s.round, "wall_s": round(s.wall_s, 3), **(s.result or {}), "error": s.error}
            for s in runs
        ]
        for name, runs in samples.items()
    }


def by_round(runs: Sequence[Sample], metric: str) -> dict[int, float]:
    """round -> the metric's value in that round (rounds whose sample failed or lacks it are absent)."""
    return {s.round: float(s.get(metric)) for s in runs if s.error is None and s.get(metric) is not None}


def paired_values(
    samples: Mapping[str, Sequence[Sample]], name: str, reference: str, metric: str
) -> tuple[list[float], list[float]]:
    """The variant's and the reference's values of ``metric`` in the rounds where both have one."""
    mine, theirs = by_round(samples.get(name, ()), metric), by_round(samples.get(reference, ()), metric)
    rounds = sorted(set(mine) & set(theirs))
    return [mine[r] for r in rounds], [theirs[r] for r in rounds]


def ratio_measurement(
    key: str,
    label: str,
    samples: Mapping[str, Sequence[Sample]],
    name: str,
    reference: str,
    metric: str,
    *,
    reference_label: str = "raw",
    limit: float | None = None,
) -> Measurement:
    """``metric`` of ``name`` over the reference's, round by round (one process per round)."""
    values, references = paired_values(samples, name, reference, metric)
    ratios = paired_log_ratios(values, references)
    return Measurement(key, label, Scale.RATIO, f"× {reference_label}", [[r] for r in ratios], limit)


def difference_measurement(
    key: str,
    label: str,
    samples: Mapping[str, Sequence[Sample]],
    name: str,
    reference: str,
    metric: str,
    *,
    limit: float | None = None,
) -> Measurement:
    """``metric`` of ``name`` minus the reference's, round by round, in seconds."""
    values, references = paired_values(samples, name, reference, metric)
    return Measurement(
        key, label, Scale.LINEAR, "s", [[d] for d in paired_differences(values, references)], limit
    )
