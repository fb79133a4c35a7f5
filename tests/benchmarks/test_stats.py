"""The suite's statistics and fairness checks, on plain numbers."""

from __future__ import annotations

import math

from benchmarks.stats import Summary, check_same_loss, check_step_counts, difference, ratio, summarize


def test_summarize_gives_median_and_range_and_skips_missing_values() -> None:
    summary = summarize([3.0, None, 1.0, math.nan, 10.0, 2.0])
    assert summary == Summary(median=2.5, low=1.0, high=10.0, count=4)


def test_summarize_of_nothing_is_none() -> None:
    assert summarize([]) is None
    assert summarize([None, math.nan]) is None


def test_ratio_and_difference_compare_medians() -> None:
    value = Summary(3.0, 1.0, 9.0, 3)
    reference = Summary(2.0, 2.0, 2.0, 1)
    assert ratio(value, reference) == 1.5
    assert difference(value, reference) == 1.0
    assert ratio(None, reference) is None
    assert ratio(value, Summary(0.0, 0.0, 0.0, 1)) is None
    assert difference(value, None) is None


def test_equal_losses_pass_the_fairness_check() -> None:
    losses = {"raw": [0.5, 0.5], "framework": [0.5, 0.5000000001]}
    assert check_same_loss(losses, "raw", rel_tol=1e-6) == []


def test_a_different_loss_is_reported_with_variant_sample_and_values() -> None:
    losses = {"raw": [0.5, 0.5], "framework": [0.5, 0.6]}
    problems = check_same_loss(losses, "raw", rel_tol=1e-6)
    assert len(problems) == 1
    assert "framework sample 1" in problems[0]
    assert "0.6" in problems[0] and "0.5" in problems[0]


def test_a_missing_reference_is_itself_a_problem() -> None:
    problems = check_same_loss({"raw": [None], "framework": [0.5]}, "raw", rel_tol=1e-6)
    assert problems and "reference" in problems[0]


def test_step_counts_must_match_exactly() -> None:
    problems = check_step_counts({"raw": [70, 70], "framework": [70, 69]}, expected=70)
    assert problems == ["framework sample 1: took 69 optimizer steps, expected 70"]
