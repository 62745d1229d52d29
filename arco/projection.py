"""The projection of a teacher's hindsight scores onto the decomposition constraint.

A teacher writes K scores in [-1, 1] for each of the n steps of a trajectory with reward R, under
sum_t mean_k x_{t,k} = R, i.e. sum of all n*K scores = K*R. Its numbers rarely meet that
exactly; the nearest scores that do are the Euclidean projection onto
{x : sum x = K*R, -1 <= x <= 1}, x_i = clip(v_i + lambda, -1, 1) for one scalar lambda.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BISECTION_STEPS = 200


def _as_scores(scores: np.ndarray | Sequence[Sequence[float]], name: str) -> np.ndarray:
    v = np.asarray(scores, dtype=np.float64)
    if v.ndim != 2:
        raise ValueError(f"{name}: scores must be 2-D [n_steps, K]; got shape {v.shape}")
    return v


def project_scores(scores: np.ndarray | Sequence[Sequence[float]], outcome: float) -> np.ndarray:
    """The nearest [n, K] scores in [-1, 1] whose total is K*R, after clamping to [-1, 1]:

        x = argmin ||x - clip(v, -1, 1)||^2  s.t.  sum x = K*R,  -1 <= x <= 1
          = clip(clip(v, -1, 1) + lambda, -1, 1)

    lambda by bisection on the nondecreasing f(lambda) = sum clip(v + lambda, -1, 1) - K*R, then
    the rounding residual is spread over the entries strictly inside the bounds so that the
    total is met within 1e-9. Raises ValueError when infeasible: n = 0, K = 0, a non-finite
    value, or |R| > n. Shapes: scores [n, K] -> [n, K] (float64).
    """
    v = _as_scores(scores, "project_scores")
    n, k = v.shape
    if n == 0 or k == 0:
        raise ValueError(f"project_scores: no scores to project (shape {v.shape})")
    if not np.isfinite(v).all() or not np.isfinite(outcome):
        raise ValueError("project_scores: scores and outcome must be finite")
    if abs(outcome) > n:
        raise ValueError(
            f"project_scores: infeasible, |R| = {abs(outcome)} > n = {n} "
            f"(n steps of mean score in [-1, 1] cannot sum to R)"
        )
    flat = np.clip(v, -1.0, 1.0).ravel()  # [n*K]
    target = k * float(outcome)
    # f(-2) = -n*K <= target <= n*K = f(2) since every clamped v is in [-1, 1].
    lo, hi = -2.0, 2.0
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if np.clip(flat + mid, -1.0, 1.0).sum() < target:
            lo = mid
        else:
            hi = mid
    x = np.clip(flat + hi, -1.0, 1.0)
    free = (x > -1.0) & (x < 1.0)
    if free.any():
        x[free] += (target - x.sum()) / free.sum()
        x = np.clip(x, -1.0, 1.0)
    return x.reshape(n, k)


def decomposition_error(scores: np.ndarray | Sequence[Sequence[float]], outcome: float) -> float:
    """|sum_t mean_k x_{t,k} - R| for scores [n, K]."""
    x = _as_scores(scores, "decomposition_error")
    if x.shape[1] == 0:
        raise ValueError("decomposition_error: scores have K = 0 criteria")
    return float(abs(x.mean(axis=1).sum() - outcome))


def decomposition_holds(
    scores: np.ndarray | Sequence[Sequence[float]], outcome: float, tol: float = 0.05
) -> bool:
    """Whether the scores decompose R: |sum_t mean_k x_{t,k} - R| < tol."""
    return decomposition_error(scores, outcome) < tol
