# ruff: noqa: RUF001 (the rendered numbers use typographic signs on purpose)
"""Confidence intervals and the met / missed / undecided rule, on plain numbers (deterministic)."""

from __future__ import annotations

import math
import random

import pytest
from benchmarks.intervals import (
    Decision,
    Interval,
    Measurement,
    Scale,
    bootstrap,
    bootstrap_change,
    decide,
    paired_differences,
    paired_log_ratios,
    t_quantile_975,
    tail_probability,
    trimmed_mean,
)


def test_trimmed_mean_drops_the_extremes_on_both_sides() -> None:
    assert trimmed_mean([1.0, 2.0, 3.0, 4.0, 100.0]) == 3.0  # 20 % of 5: one value each side
    assert trimmed_mean([1.0, 2.0, 3.0]) == 2.0  # 20 % of 3 rounds down to none
    assert trimmed_mean([5.0]) == 5.0
    with pytest.raises(ValueError):
        trimmed_mean([])


def test_t_quantiles_follow_the_table_and_approach_the_normal() -> None:
    assert t_quantile_975(1) == 12.706
    assert t_quantile_975(30) == 2.042
    assert t_quantile_975(60) == pytest.approx(2.000, abs=2e-3)
    assert t_quantile_975(120) == pytest.approx(1.980, abs=2e-3)
    assert t_quantile_975(10_000) == pytest.approx(1.960, abs=1e-3)


def test_small_samples_take_wider_percentiles() -> None:
    assert tail_probability(3) < 1e-6  # three rounds: the whole bootstrap distribution
    assert 0.005 < tail_probability(10) < 0.015
    assert tail_probability(1000) == pytest.approx(0.025, abs=5e-4)
    with pytest.raises(ValueError):
        tail_probability(1)


def test_the_same_numbers_give_the_same_interval() -> None:
    values = [[random.Random(i).gauss(0, 1)] for i in range(20)]
    assert bootstrap(values) == bootstrap(values)
    first = bootstrap(values)
    assert first.low is not None and first.high is not None
    assert first.low < first.estimate < first.high
    assert first.units == 20


def test_one_value_has_no_interval_and_decides_nothing() -> None:
    interval = bootstrap([[0.5]])
    assert interval == Interval(0.5, None, None, 1)
    assert decide(interval, 1.0) is Decision.UNDECIDED
    with pytest.raises(ValueError):
        bootstrap([[], []])


def _coverage(rounds: int, trials: int, *, seed: int) -> float:
    """How often the 95 % interval of ``rounds`` normal values holds the true mean 0."""
    rng = random.Random(seed)
    hits = 0
    for trial in range(trials):
        values = [[rng.gauss(0.0, 1.0)] for _ in range(rounds)]
        interval = bootstrap(values, statistic=lambda v: math.fsum(v) / len(v), resamples=400, seed=trial)
        assert interval.low is not None and interval.high is not None
        hits += interval.low <= 0.0 <= interval.high
    return hits / trials


def test_intervals_hold_the_true_value_about_95_percent_of_the_time() -> None:
    assert 0.91 <= _coverage(30, 300, seed=1) <= 0.99


def test_few_rounds_are_not_overconfident() -> None:
    # A plain percentile bootstrap of 5 values covers ~80 %; the expansion brings it back near 95 %.
    assert _coverage(5, 300, seed=2) >= 0.90


def test_differences_between_processes_widen_the_interval() -> None:
    rng = random.Random(3)
    # Four processes, each offset by its own amount (memory placement), 50 quiet rounds each.
    offsets = [-0.02, 0.0, 0.01, 0.03]
    groups = [[offset + rng.gauss(0, 0.005) for _ in range(50)] for offset in offsets]
    grouped = bootstrap(groups)
    pooled = bootstrap([[v] for g in groups for v in g])
    assert grouped.estimate == pytest.approx(pooled.estimate)
    assert grouped.high - grouped.low > 2 * (pooled.high - pooled.low)


def test_the_estimate_ignores_a_few_interrupted_rounds() -> None:
    rounds = [0.01] * 45 + [0.5] * 5  # five blocks hit by another program
    interval = bootstrap([[v] for v in rounds])
    assert interval.estimate == pytest.approx(0.01)


def test_decisions_need_the_whole_interval_on_one_side() -> None:
    assert decide(Interval(1.01, 1.00, 1.02, 50), 1.02) is Decision.MET  # at the limit counts as within
    assert decide(Interval(1.03, 1.021, 1.04, 50), 1.02) is Decision.MISSED
    assert decide(Interval(1.01, 0.99, 1.03, 50), 1.02) is Decision.UNDECIDED  # estimate within, interval not
    assert decide(Interval(1.03, 1.01, 1.05, 50), 1.02) is Decision.UNDECIDED  # estimate beyond, interval not
    assert decide(None, 1.02) is Decision.NOT_MEASURED


def test_paired_values_skip_rounds_without_both_numbers() -> None:
    assert paired_log_ratios([2.0, None, 3.0, 0.0], [1.0, 1.0, None, 1.0]) == [math.log(2.0)]
    assert paired_differences([2.0, None, 5.0], [1.5, 1.0, 4.0]) == [0.5, 1.0]


def test_a_ratio_measurement_reports_on_the_ratio_scale_and_survives_json() -> None:
    groups = [[math.log(1.01) + 0.002 * ((i % 5) - 2)] for i in range(40)]
    measurement = Measurement("ab/tiny/x/cpu", "x", Scale.RATIO, "× raw", groups, limit=1.02)
    assert measurement.interval is not None
    assert measurement.interval.estimate == pytest.approx(1.01, rel=1e-6)
    assert measurement.decision is Decision.MET
    again = Measurement.from_dict(measurement.as_dict())
    assert again.interval == measurement.interval
    assert again.as_dict()["decision"] == "met"


def test_exact_measurements_show_their_range_without_resampling() -> None:
    measurement = Measurement("i/x/per_step", "x", Scale.EXACT, "instructions", [[2_500_000.0, 2_500_400.0]])
    assert measurement.interval == Interval(2_500_200.0, 2_500_000.0, 2_500_400.0, 2)


def test_a_measurement_without_rounds_is_not_measured() -> None:
    measurement = Measurement("k", "x", Scale.RATIO, "× raw", [], limit=1.05)
    assert measurement.interval is None
    assert measurement.decision is Decision.NOT_MEASURED


def test_a_change_between_runs_is_resolved_only_when_it_is_larger_than_the_noise() -> None:
    rng = random.Random(4)
    old = [[rng.gauss(0.02, 0.01)] for _ in range(60)]
    same = [[rng.gauss(0.02, 0.01)] for _ in range(60)]
    faster = [[rng.gauss(0.0, 0.01)] for _ in range(60)]
    unchanged = bootstrap_change(old, same)
    assert unchanged.low < 0 < unchanged.high
    improved = bootstrap_change(old, faster)
    assert improved.high < 0
    assert improved.estimate == pytest.approx(-0.02, abs=0.005)
