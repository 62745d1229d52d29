"""common.bootstrap: the paired bootstrap over questions, the two-level one over seeds and
questions, and the ratio interval, on hand-made cases."""

from __future__ import annotations

import math

import pytest

from common.bootstrap import (
    paired_bootstrap,
    percentile_interval,
    ratio_interval,
    two_level_bootstrap,
)


def test_percentile_interval_takes_the_draws_at_the_tail_indices():
    # 100 draws 0..99 shuffled; confidence 0.5: tail 0.25 -> indices 25 and 75
    draws = [float((7 * i) % 100) for i in range(100)]
    assert percentile_interval(draws, 0.5) == (25.0, 75.0)
    with pytest.raises(ValueError, match="confidence"):
        percentile_interval(draws, 1.0)
    with pytest.raises(ValueError, match="no draws"):
        percentile_interval([])


def test_paired_bootstrap_gives_the_numbers_it_gave_before_it_moved_here():
    # pinned from experiments.compare's own copy before the three copies became one
    out = paired_bootstrap([1.0, 0.0, 0.0, -1.0, 1.0, 1.0, 0.0, 1.0], 1000, 0.9, 3)
    assert out["n"] == 8 and out["delta"] == 0.375
    assert (out["ci_low"], out["ci_high"]) == (0.0, 0.75)
    assert out["p_le_0"] == 0.117
    # sd of the eight differences = sqrt(3.875 / 7); MDE = 2.8 sd / sqrt(8)
    assert out["mde"] == pytest.approx(2.8 * math.sqrt(3.875 / 7) / math.sqrt(8))


def test_paired_bootstrap_of_two_values_covers_both():
    # n = 2 draws of {0, 1}: means 0, 0.5, 1 with chances 1/4, 1/2, 1/4
    out = paired_bootstrap([0.0, 1.0], resamples=4000)
    assert (out["ci_low"], out["ci_high"]) == (0.0, 1.0)
    assert out["p_le_0"] == pytest.approx(0.25, abs=0.03)


def test_two_level_with_no_seed_noise_matches_the_bootstrap_over_questions():
    # every seed gives the same per-question differences: resampling seeds changes nothing
    diffs = [1.0, 0.0, 0.0, 1.0, -1.0, 1.0, 0.0, 1.0, 1.0, 0.0] * 5
    arm = [diffs, diffs, diffs]
    zero = [[0.0] * len(diffs)] * 3
    fixed = paired_bootstrap(diffs, resamples=20_000)
    both = two_level_bootstrap(arm, zero, resamples=20_000)
    assert both["n"] == 50 and both["seeds"] == 3
    assert both["delta"] == pytest.approx(fixed["delta"]) == pytest.approx(0.4)
    assert both["ci_low"] == pytest.approx(fixed["ci_low"], abs=0.025)
    assert both["ci_high"] == pytest.approx(fixed["ci_high"], abs=0.025)
    assert both["mde"] == pytest.approx(fixed["mde"], rel=0.05)


def test_two_level_widens_when_the_seeds_disagree():
    # seed 0: the arm +1 on every question, seed 1: 0, seed 2: -1. Pooled over seeds each
    # question's Δ is 0, so the fixed-seed interval is [0, 0]; drawing 3 seeds of {+1, 0, -1}
    # gives a mean of -1 with chance 1/27 > 0.025 (and +1 likewise): the interval is [-1, +1]
    q = 20
    arm = [[1.0] * q, [0.0] * q, [-1.0] * q]
    ref = [[0.0] * q] * 3
    fixed = paired_bootstrap([0.0] * q)
    both = two_level_bootstrap(arm, ref, resamples=10_000)
    assert (fixed["ci_low"], fixed["ci_high"], fixed["mde"]) == (0.0, 0.0, 0.0)
    assert both["delta"] == 0.0
    assert (both["ci_low"], both["ci_high"]) == (-1.0, 1.0)
    # the draws' sd is that of a mean of 3 seeds drawn from {+1, 0, -1}: sqrt((2/3) / 3)
    assert both["mde"] == pytest.approx(2.8 * math.sqrt(2 / 9), rel=0.05)


def test_two_level_pairs_seed_s_with_seed_s():
    # the arm beats its reference by exactly 0.5 at every seed, though the seeds differ a lot:
    # paired seed by seed the spread over seeds cancels
    arm = [[1.0, 1.0], [0.5, 0.5], [0.75, 0.75]]
    ref = [[0.5, 0.5], [0.0, 0.0], [0.25, 0.25]]
    out = two_level_bootstrap(arm, ref, resamples=500)
    assert out["delta"] == out["ci_low"] == out["ci_high"] == 0.5
    assert out["p_le_0"] == 0.0 and out["mde"] == pytest.approx(0.0, abs=1e-12)


def test_two_level_with_one_seed_is_the_bootstrap_over_questions():
    diffs = [1.0, -1.0] * 100
    out = two_level_bootstrap([diffs], [[0.0] * 200], resamples=4000)
    # mean 0, sd 1 over 200 questions: 0 ± 1.96 / sqrt(200) = ± 0.139
    assert out["ci_low"] == pytest.approx(-0.139, abs=0.02)
    assert out["ci_high"] == pytest.approx(0.139, abs=0.02)


def test_two_level_rejects_tables_of_other_shapes():
    with pytest.raises(ValueError, match="seeds x questions"):
        two_level_bootstrap([[1.0, 0.0]], [[1.0, 0.0], [0.0, 0.0]])
    with pytest.raises(ValueError, match="seeds x questions"):
        two_level_bootstrap([1.0, 0.0], [1.0, 0.0])


def test_ratio_interval_of_a_mean_and_of_a_ratio():
    assert ratio_interval([0.5] * 4, resamples=100) == (0.5, 0.5)
    # every question 1 of 2: the ratio of sums is 0.5 however the questions are drawn
    assert ratio_interval([1.0] * 3, [2.0] * 3, resamples=100) == (0.5, 0.5)
    # no denominator anywhere: 0 by convention
    assert ratio_interval([0.0, 0.0], [0.0, 0.0], resamples=100) == (0.0, 0.0)
    with pytest.raises(ValueError, match="denominators"):
        ratio_interval([1.0], [1.0, 2.0])
