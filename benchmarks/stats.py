"""The numbers the suite reports and the checks it makes: medians with their spread, ratios, fairness.

Pure functions over plain values, so that they are tested without running anything.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Summary:
    """Median and range of one measurement over its samples (one sample per fresh process)."""

    median: float
    low: float
    high: float
    count: int

    def as_dict(self) -> dict[str, float | int]:
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.count}


def summarize(values: Iterable[float | None]) -> Summary | None:
    """Median, min and max of the values that are present; None when there are none."""
    present = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not present:
        return None
    return Summary(statistics.median(present), min(present), max(present), len(present))


def ratio(value: Summary | None, reference: Summary | None) -> float | None:
    """``value`` over ``reference``, median against median; None when either is missing."""
    if value is None or reference is None or reference.median == 0:
        return None
    return value.median / reference.median


def difference(value: Summary | None, reference: Summary | None) -> float | None:
    """``value`` minus ``reference``, median against median; None when either is missing."""
    if value is None or reference is None:
        return None
    return value.median - reference.median


def check_same_loss(
    losses: Mapping[str, Sequence[float | None]], reference: str, rel_tol: float, abs_tol: float = 0.0
) -> list[str]:
    """Every sample of every variant must end at the reference's final loss.

    Equal final losses on the same data mean the variants did the same training, so their times
    are comparable. A variant with no loss at all (it crashed) is reported by the caller, not here.

    Returns:
        One message per disagreement (empty when the comparison is fair).
    """
    reference_values = [v for v in losses.get(reference, ()) if v is not None]
    if not reference_values:
        return [f"no final loss from the reference variant {reference!r}: nothing to compare against"]
    expected = reference_values[0]
    problems = []
    for name, values in losses.items():
        for index, value in enumerate(values):
            if value is None:
                continue
            if not math.isclose(value, expected, rel_tol=rel_tol, abs_tol=abs_tol):
                problems.append(
                    f"{name} sample {index}: final loss {value!r} differs from {reference}'s {expected!r} "
                    f"by more than rel_tol={rel_tol:g} (relative difference {_relative(value, expected):.3g})"
                )
    return problems


def check_step_counts(counts: Mapping[str, Sequence[int | None]], expected: int) -> list[str]:
    """Every variant must have taken exactly ``expected`` optimizer steps."""
    return [
        f"{name} sample {index}: took {count} optimizer steps, expected {expected}"
        for name, values in counts.items()
        for index, count in enumerate(values)
        if count is not None and count != expected
    ]


def _relative(value: float, expected: float) -> float:
    scale = max(abs(value), abs(expected))
    return abs(value - expected) / scale if scale else 0.0
