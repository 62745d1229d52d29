"""Percentile bootstrap intervals of mean differences: one place for every comparison's numbers.

Two designs, both seeded and pure (lists or arrays in, a dict out):

* ``paired_bootstrap(diffs)``: one difference per question (already averaged over seeds); the
  questions are drawn with replacement. Its interval holds question noise only: the seeds are
  taken as fixed.
* ``two_level_bootstrap(arm, reference)``: an S seeds x Q questions table per side, the arm's
  seed s paired with the reference's seed s (with a ``start`` baseline: the run's own step 0).
  Each draw takes S seeds *and* Q questions with replacement, so its interval also holds the
  noise of training over seeds: what a rerun with other seeds could give.

The minimal detectable difference (``mde``) of either is 2.8 standard errors of the mean (a
two-sided 5% test with 80% power): of the question differences for the first, the bootstrap
draws' standard deviation for the second. ``ratio_interval`` is the one-sample interval of a
ratio of sums (or a mean) over questions.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence

import numpy as np

# standard errors a difference must span to be detected by a two-sided 5% test with 80% power
MDE_Z = 2.8


def percentile_interval(draws: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """The (low, high) percentile interval of bootstrap ``draws`` (sorted here): the draws at
    indices ``int(tail * R)`` and ``int((1 - tail) * R)`` (capped at R − 1), tail = (1 − c) / 2."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), not {confidence}")
    ordered = sorted(draws)
    r = len(ordered)
    if not r:
        raise ValueError("percentile_interval: no draws")
    tail = (1 - confidence) / 2
    return float(ordered[min(int(tail * r), r - 1)]), float(
        ordered[min(int((1 - tail) * r), r - 1)]
    )


def paired_bootstrap(
    diffs: Sequence[float], resamples: int = 10_000, confidence: float = 0.95, seed: int = 0
) -> dict[str, float]:
    """mean(diffs) with its percentile bootstrap interval over questions drawn with replacement
    (``random.Random(seed)``), ``p_le_0`` (share of draws with mean ≤ 0) and ``mde``: 2.8
    standard errors of the mean (sample sd / √n)."""
    if not diffs:
        raise ValueError("paired_bootstrap: no paired differences")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, not {resamples}")
    n = len(diffs)
    rng = random.Random(seed)
    draws = [statistics.fmean(rng.choices(diffs, k=n)) for _ in range(resamples)]
    low, high = percentile_interval(draws, confidence)
    sd = statistics.stdev(diffs) if n > 1 else 0.0
    return {
        "n": n,
        "delta": statistics.fmean(diffs),
        "ci_low": low,
        "ci_high": high,
        "confidence": confidence,
        "p_le_0": sum(d <= 0 for d in draws) / resamples,
        "mde": MDE_Z * sd / math.sqrt(n),
    }


def seed_by_question(
    arm: Sequence[Sequence[float]], reference: Sequence[Sequence[float]]
) -> np.ndarray:
    """arm − reference as an S x Q array (row s: the arm's seed s against the reference's seed
    s); both must be S x Q with the same shape and S, Q ≥ 1."""
    a = np.asarray(arm, dtype=float)
    b = np.asarray(reference, dtype=float)
    if a.ndim != 2 or a.shape != b.shape or 0 in a.shape:
        raise ValueError(
            f"two_level_bootstrap: arm and reference must be seeds x questions tables of one "
            f"shape, not {a.shape} and {b.shape}"
        )
    return a - b


def two_level_bootstrap(
    arm: Sequence[Sequence[float]],
    reference: Sequence[Sequence[float]],
    resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, float]:
    """Δ = mean over seeds and questions of arm − reference (S x Q tables, seed s against seed
    s) with its percentile interval over draws of S seeds and Q questions, both with replacement
    (``numpy.random.default_rng(seed)``; a draw's Δ* is the mean of the drawn rows' drawn
    columns). ``p_le_0``: share of draws ≤ 0; ``mde``: 2.8 x the draws' standard deviation;
    ``n``: the questions; ``seeds``: S. With one seed it is the bootstrap over questions."""
    d = seed_by_question(arm, reference)
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, not {resamples}")
    s, q = d.shape
    rng = np.random.default_rng(seed)
    seed_w = rng.multinomial(s, np.full(s, 1 / s), size=resamples) / s  # R x S weights
    question_w = rng.multinomial(q, np.full(q, 1 / q), size=resamples) / q  # R x Q weights
    draws = ((seed_w @ d) * question_w).sum(axis=1)
    low, high = percentile_interval(draws.tolist(), confidence)
    return {
        "n": q,
        "seeds": s,
        "delta": float(d.mean()),
        "ci_low": low,
        "ci_high": high,
        "confidence": confidence,
        "p_le_0": float((draws <= 0).mean()),
        "mde": MDE_Z * float(draws.std(ddof=1)) if resamples > 1 else 0.0,
    }


def ratio_interval(
    top: Sequence[float],
    bottom: Sequence[float] | None = None,
    resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of sum(top) / sum(bottom) over questions drawn with
    replacement (``bottom`` None: the mean of ``top``; a draw whose bottom sums to 0 counts 0)."""
    n = len(top)
    if not n:
        raise ValueError("ratio_interval: no questions")
    if bottom is not None and len(bottom) != n:
        raise ValueError(f"ratio_interval: {n} numerators but {len(bottom)} denominators")
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    num = np.asarray(top, dtype=float)[idx].sum(1)
    if bottom is None:
        draws = num / n
    else:
        den = np.asarray(bottom, dtype=float)[idx].sum(1)
        draws = np.divide(num, den, out=np.zeros_like(num), where=den > 0)
    return percentile_interval(draws.tolist(), confidence)
