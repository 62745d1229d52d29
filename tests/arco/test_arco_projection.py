from __future__ import annotations

import itertools
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arco.projection import decomposition_error, decomposition_holds, project_scores


@cache
def _assignments(m: int) -> np.ndarray:
    """Every map of m coordinates to 0 (at -1), 1 (at +1) or 2 (free): [3^m, m]."""
    return np.array(list(itertools.product((0, 1, 2), repeat=m)), dtype=np.int8).reshape(-1, m)


def brute_force_distance(v: np.ndarray, target: float) -> float:
    """min ||x - v||^2 over {sum x = target, -1 <= x <= 1} by exact active-set enumeration.

    For each assignment the free coordinates solve min sum_F (x_i - v_i)^2 s.t. sum_F x_i = rest
    in closed form (x_i = v_i + (rest - sum_F v) / |F|); the optimum is the best feasible one.
    """
    v = v.ravel()
    a = _assignments(v.size)  # [M, m]
    free = a == 2
    n_free = free.sum(axis=1)  # [M]
    fixed = np.where(a == 0, -1.0, np.where(a == 1, 1.0, 0.0))  # [M, m]
    rest = target - fixed.sum(axis=1)  # [M]
    shift = (rest - (free * v).sum(axis=1)) / np.maximum(n_free, 1)  # [M]
    x = np.where(free, v + shift[:, None], fixed)  # [M, m]
    feasible = (
        (np.abs(x.sum(axis=1) - target) < 1e-9)
        & (x >= -1 - 1e-12).all(axis=1)
        & (x <= 1 + 1e-12).all(axis=1)
    )
    return float(((x - v) ** 2).sum(axis=1)[feasible].min())


@st.composite
def annotations(draw, max_size: int = 12):
    n = draw(st.integers(1, 4))
    k = draw(st.integers(1, min(3, max_size // n)))
    values = st.floats(-3.0, 3.0, allow_nan=False)
    scores = draw(st.lists(st.lists(values, min_size=k, max_size=k), min_size=n, max_size=n))
    return np.array(scores), draw(st.sampled_from([0.0, 1.0]))


def test_project_scores_already_feasible_is_unchanged():
    v = [[0.5, 0.5], [0.25, 0.75]]  # sum 2 = K * R with K = 2, R = 1
    np.testing.assert_allclose(project_scores(v, 1.0), v, atol=1e-12)


def test_project_scores_by_hand_all_free():
    # clamp: [1, 0.2, -0.4, 0.1], total 0.9, target K * R = 2. The 1 stays at its bound; the
    # other three shift by lambda with 0.2 + -0.4 + 0.1 + 3 lambda = 1, lambda = 1.1 / 3
    got = project_scores([[3.0, 0.2], [-0.4, 0.1]], 1.0)
    lam = 1.1 / 3
    np.testing.assert_allclose(got, [[1.0, 0.2 + lam], [-0.4 + lam, 0.1 + lam]], atol=1e-9)
    assert got.dtype == np.float64


def test_project_scores_by_hand_one_clipped():
    # target -2 from [0.9, 0.8, -0.5, 0.0] (total 1.2). All free: lambda = -0.8 sends -0.5 to
    # -1.3, so it sits at -1 and 0.9 + 0.8 + 0.0 + 3 lambda - 1 = -2, lambda = -0.9
    got = project_scores([[0.9, 0.8], [-0.5, 0.0]], -1.0)
    np.testing.assert_allclose(got, [[0.0, -0.1], [-1.0, -0.9]], atol=1e-9)


def test_project_scores_extremes():
    np.testing.assert_allclose(project_scores([[1.0, 1.0], [1.0, 1.0]], 0.0), np.zeros((2, 2)))
    # |R| = n: the only feasible point is all +1 (or all -1)
    ones = np.ones((2, 2))
    np.testing.assert_allclose(project_scores([[-3.0, 0.0], [0.2, 0.4]], 2.0), ones, atol=1e-12)
    np.testing.assert_allclose(project_scores([[0.5]], -1.0), -np.ones((1, 1)), atol=1e-12)


@pytest.mark.parametrize(
    ("scores", "outcome", "message"),
    [
        ([[0.1, 0.2], [0.3, 0.4]], 3.0, "infeasible"),
        ([[0.1, 0.2]], -1.5, "infeasible"),
        (np.zeros((0, 3)), 0.0, "no scores"),
        (np.zeros((2, 0)), 0.0, "no scores"),
        ([[0.1, float("nan")]], 0.0, "finite"),
        ([[0.1, float("inf")]], 0.0, "finite"),
        ([[0.1, 0.2]], float("nan"), "finite"),
        ([0.1, 0.2], 0.0, "2-D"),
        ([], 0.0, "2-D"),
        (np.zeros((1, 2, 2)), 0.0, "2-D"),
    ],
)
def test_project_scores_rejects(scores, outcome, message):
    with pytest.raises(ValueError, match=message):
        project_scores(scores, outcome)


def test_decomposition_error_by_hand():
    scores = [[0.3, 0.6, 0.0], [1.0, 0.5, 0.0]]  # step means 0.3 and 0.5: sum 0.8
    assert decomposition_error(scores, 1.0) == pytest.approx(0.2)
    assert decomposition_error(scores, 0.0) == pytest.approx(0.8)
    assert not decomposition_holds(scores, 1.0)
    assert decomposition_holds(scores, 1.0, tol=0.25)
    assert decomposition_holds([[0.5, 0.4], [0.3, 0.7]], 0.94)  # error 0.04 < 0.05
    with pytest.raises(ValueError, match="2-D"):
        decomposition_error([0.1, 0.2], 0.0)


@settings(max_examples=200)
@given(annotations())
def test_projection_meets_constraint_and_bounds(case):
    v, r = case
    x = project_scores(v, r)
    assert x.shape == v.shape
    assert abs(x.sum() - v.shape[1] * r) < 1e-9
    assert decomposition_error(x, r) < 1e-6
    assert decomposition_holds(x, r)
    assert (x >= -1.0).all() and (x <= 1.0).all()


@settings(max_examples=200)
@given(annotations())
def test_projection_is_idempotent(case):
    v, r = case
    x = project_scores(v, r)
    np.testing.assert_allclose(project_scores(x, r), x, atol=1e-9)


@settings(max_examples=200)
@given(annotations(max_size=9))
def test_projection_is_the_nearest_point(case):
    v, r = case
    clamped = np.clip(v, -1.0, 1.0)
    x = project_scores(v, r)
    best = brute_force_distance(clamped, v.shape[1] * r)
    assert ((x - clamped) ** 2).sum() == pytest.approx(best, abs=1e-9)
