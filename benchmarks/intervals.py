# ruff: noqa: RUF002, RUF003 (formulas and units use typographic signs on purpose)
"""Confidence intervals for the suite's numbers, and the met / missed / undecided rule for targets.

Every comparison is *paired*: in each round the variant and its reference ran under the same
conditions (back to back in one round of fresh processes, or in neighbouring blocks of one
process), so the unit of evidence is one round's ratio (kept as its logarithm, so that 1.05× and
1/1.05× are symmetric) or one round's difference. A measurement is the list of those values,
grouped by the process they came from where one process gave many (the in-process A/B case).

The estimate is a 20 % trimmed mean of the paired values: the mean's efficiency on well-behaved
rounds (about 94 % of it for normal noise) with the median's indifference to the few rounds that
another program on the machine interrupted. The 95 % interval is a percentile bootstrap over the
same statistic, resampling processes and then rounds within them (two levels, so that differences
between processes — memory placement, say — widen the interval instead of hiding), with
Hesterberg's small-sample expansion: with ``n`` rounds the percentiles are taken at the tail
probability of a Student ``t`` with ``n − 1`` degrees of freedom scaled by ``√(n / (n − 1))``,
which undoes the plain percentile interval's known narrowness when ``n`` is small (with three
rounds it spans the whole bootstrap distribution; from a few dozen rounds on it is the plain one).

A target is **met** when the whole interval is within the limit, **missed** when the whole interval
is beyond it, and **undecided** when the interval straddles it — never on a point estimate.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from statistics import NormalDist
from typing import Any

LEVEL = 0.95
RESAMPLES = 2000
TRIM = 0.2
SEED = 20240601

# Student t quantiles at 0.975 for 1..30 degrees of freedom (standard tables).
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def trimmed_mean(values: Sequence[float], trim: float = TRIM) -> float:
    """Mean of ``values`` without the lowest and highest ``floor(trim * n)`` of them."""
    if not values:
        raise ValueError("trimmed_mean of no values")
    ordered = sorted(values)
    cut = int(len(ordered) * trim)
    kept = ordered[cut : len(ordered) - cut]
    return math.fsum(kept) / len(kept)


def t_quantile_975(degrees: int) -> float:
    """The 0.975 quantile of Student's t (table up to 30 degrees of freedom, Cornish–Fisher beyond)."""
    if degrees < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {degrees}")
    if degrees <= len(_T975):
        return _T975[degrees - 1]
    z = NormalDist().inv_cdf(0.975)
    v = float(degrees)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
    )


def tail_probability(units: int) -> float:
    """The lower percentile used for a 95 % interval from ``units`` observations (expanded when few)."""
    if units < 2:
        raise ValueError("an interval needs at least two observations")
    widened = math.sqrt(units / (units - 1)) * t_quantile_975(units - 1)
    return 1.0 - NormalDist().cdf(widened)


@dataclass(frozen=True)
class Interval:
    """An estimate with its 95 % interval, on the scale the values were given in.

    ``low``/``high`` are None when there was a single observation (nothing to say about the
    spread); ``units`` counts the paired observations (rounds) behind it.
    """

    estimate: float
    low: float | None
    high: float | None
    units: int

    def map(self, function: Callable[[float], float]) -> Interval:
        """The same interval through a monotone increasing ``function`` (``math.exp`` for ratios)."""
        return Interval(
            function(self.estimate),
            None if self.low is None else function(self.low),
            None if self.high is None else function(self.high),
            self.units,
        )

    def as_dict(self) -> dict[str, Any]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "units": self.units}


def bootstrap(
    groups: Sequence[Sequence[float]],
    *,
    statistic: Callable[[Sequence[float]], float] = trimmed_mean,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Interval:
    """The statistic of all values with its 95 % percentile-bootstrap interval (see the module doc).

    Args:
        groups: the values, grouped by the process that produced them (one group per value for
            one-process-per-round measurements). Empty groups are ignored.
        statistic: what is estimated from the pooled values.
        resamples: bootstrap resamples; the default gives percentiles stable to a small fraction
            of the interval's width.
        seed: the resampling is deterministic, so the same numbers give the same interval.

    Raises:
        ValueError: there are no values at all.
    """
    kept = [list(g) for g in groups if len(g) > 0]
    pooled = [v for g in kept for v in g]
    if not pooled:
        raise ValueError("bootstrap needs at least one value")
    estimate = statistic(pooled)
    if len(pooled) < 2:
        return Interval(estimate, None, None, len(pooled))
    rng = random.Random(seed)
    draws = sorted(_resampled(rng, kept, statistic) for _ in range(resamples))
    tail = tail_probability(len(pooled))
    return Interval(estimate, _quantile(draws, tail), _quantile(draws, 1.0 - tail), len(pooled))


def bootstrap_change(
    old: Sequence[Sequence[float]],
    new: Sequence[Sequence[float]],
    *,
    statistic: Callable[[Sequence[float]], float] = trimmed_mean,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Interval:
    """``statistic(new) − statistic(old)`` for two independent runs, with its 95 % interval.

    Each run is resampled on its own (as :func:`bootstrap` does); on the log scale the
    difference is the log of the ratio new/old.
    """
    old_kept = [list(g) for g in old if g]
    new_kept = [list(g) for g in new if g]
    if not old_kept or not new_kept:
        raise ValueError("bootstrap_change needs values in both runs")
    old_values = [v for g in old_kept for v in g]
    new_values = [v for g in new_kept for v in g]
    estimate = statistic(new_values) - statistic(old_values)
    units = min(len(old_values), len(new_values))
    if units < 2:
        return Interval(estimate, None, None, units)
    rng = random.Random(seed)
    draws = sorted(
        _resampled(rng, new_kept, statistic) - _resampled(rng, old_kept, statistic) for _ in range(resamples)
    )
    tail = tail_probability(units)
    return Interval(estimate, _quantile(draws, tail), _quantile(draws, 1.0 - tail), units)


def _resampled(
    rng: random.Random, groups: list[list[float]], statistic: Callable[[Sequence[float]], float]
) -> float:
    """The statistic of one two-level resample: groups with replacement, then values within each."""
    chosen = rng.choices(groups, k=len(groups)) if len(groups) > 1 else groups
    sample: list[float] = []
    for group in chosen:
        sample.extend(rng.choices(group, k=len(group)) if len(group) > 1 else group)
    return statistic(sample)


def _quantile(ordered: Sequence[float], probability: float) -> float:
    """Linear interpolation between order statistics (``ordered`` must be sorted)."""
    position = probability * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    fraction = position - below
    return ordered[below] + (ordered[above] - ordered[below]) * fraction


# ---------------------------------------------------------------- paired values


def paired_log_ratios(values: Sequence[float | None], reference: Sequence[float | None]) -> list[float]:
    """``log(value / reference)`` round by round, for rounds where both are present and positive."""
    return [
        math.log(v / r)
        for v, r in zip(values, reference)
        if v is not None and r is not None and v > 0 and r > 0 and math.isfinite(v / r)
    ]


def paired_differences(values: Sequence[float | None], reference: Sequence[float | None]) -> list[float]:
    """``value − reference`` round by round, for rounds where both are present."""
    return [
        v - r
        for v, r in zip(values, reference)
        if v is not None and r is not None and math.isfinite(v) and math.isfinite(r)
    ]


# ---------------------------------------------------------------- decisions


class Decision(str, Enum):
    MET = "met"
    MISSED = "missed"
    UNDECIDED = "undecided"
    NOT_MEASURED = "not measured"


def decide(interval: Interval | None, limit: float) -> Decision:
    """Met when the whole interval is at or below ``limit``, missed when it is all above, else undecided.

    An estimate without an interval (one round) is undecided: one observation says nothing
    about how far the next one may land.
    """
    if interval is None:
        return Decision.NOT_MEASURED
    if interval.low is None or interval.high is None:
        return Decision.UNDECIDED
    if interval.high <= limit:
        return Decision.MET
    if interval.low > limit:
        return Decision.MISSED
    return Decision.UNDECIDED


# ---------------------------------------------------------------- measurements


class Scale(str, Enum):
    """How a measurement's values combine: log ratios, plain differences/values, or exact counts."""

    RATIO = "ratio"  # values are log(variant / reference); shown as exp(), "× reference"
    LINEAR = "linear"  # values are differences or plain values in ``unit``
    EXACT = "exact"  # deterministic values (instruction counts): their mean and range, no resampling


@dataclass
class Measurement:
    """One number of the report with the evidence behind it, as kept in the JSON for ``--compare``.

    Attributes:
        key: stable identity across runs, ``case/table/variant/metric``.
        label: what a reader sees.
        scale: how the values combine (see :class:`Scale`).
        unit: ``"× raw"`` for a ratio, ``"s"`` for a time, ``"instructions"`` for a count.
        groups: the paired values per process (see the module doc).
        limit: the target's limit on the displayed scale, if this measurement has a target.
    """

    key: str
    label: str
    scale: Scale
    unit: str
    groups: list[list[float]]
    limit: float | None = None
    interval: Interval | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.scale = Scale(self.scale)
        if any(self.groups):
            if self.scale is Scale.EXACT:
                # Repeated counts should agree; if they do not, their range shows by how much.
                values = sorted(v for g in self.groups for v in g)
                self.interval = Interval(math.fsum(values) / len(values), values[0], values[-1], len(values))
            else:
                self.interval = bootstrap(self.groups)
                if self.scale is Scale.RATIO:
                    self.interval = self.interval.map(math.exp)

    @property
    def decision(self) -> Decision | None:
        return None if self.limit is None else decide(self.interval, self.limit)

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "scale": self.scale.value,
            "unit": self.unit,
            "limit": self.limit,
            "interval": None if self.interval is None else self.interval.as_dict(),
            "decision": None if self.decision is None else self.decision.value,
            "groups": self.groups,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        return cls(
            data["key"], data["label"], Scale(data["scale"]), data["unit"], data["groups"], data.get("limit")
        )
