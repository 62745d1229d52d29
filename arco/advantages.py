"""ARCO's advantages: dense (rubric step rewards, position-bucket baseline) and sparse (group).

Dense phase (arco/README.md, "The method"): step rewards s_t from the rubric model, reward-to-go
G_t, a baseline b_t = the batch mean of G over the step's position bucket, and
A_t = c * (G_t - b_t). Sparse phase: A = R - mean of R over the question's group, no std division.

Both as parts (``common.rewards.AdvantageEstimator``) for any trainer: ``DenseAdvantages`` (the
step scores and the trainer's ``common.rewards.step_layout`` in ``rewards.extras``; per-token
advantages) and ``sparse_group``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from common.rewards import Rewards, spread_to_tokens

LAYOUT = ("step_kinds", "step_tokens", "response_tokens")

STEP_KINDS = ("search", "answer", "invalid")


def reward_to_go(step_rewards: Sequence[float]) -> list[float]:
    """G_t = sum_{k >= t} s_k, for each step t of one trajectory."""
    out = []
    total = 0.0
    for s in reversed(step_rewards):
        total += float(s)
        out.append(total)
    return out[::-1]


def position_buckets(kinds: Sequence[str], invalid_bucket: bool = True) -> list[str]:
    """The baseline bucket of each step of one trajectory, from its step kinds.

    The i-th search (1-based, counting searches only) is ``search_i``; the answer step is
    ``terminal``, and so is the last step of a trajectory without one, whatever its kind. A
    non-final invalid step is ``invalid`` when ``invalid_bucket``, else ``terminal`` (the
    release's behaviour: it shares the answer steps' baseline).
    """
    bad = [k for k in kinds if k not in STEP_KINDS]
    if bad:
        raise ValueError(f"position_buckets: step kinds must be in {STEP_KINDS}; got {bad[0]!r}")
    has_answer = "answer" in kinds
    out = []
    n_search = 0
    for t, kind in enumerate(kinds):
        if kind == "search":
            n_search += 1
        if kind == "answer" or (not has_answer and t == len(kinds) - 1):
            out.append("terminal")
        elif kind == "search":
            out.append(f"search_{n_search}")
        else:
            out.append("invalid" if invalid_bucket else "terminal")
    return out


def bucket_baseline(
    returns: Sequence[Sequence[float]], buckets: Sequence[Sequence[str]]
) -> list[list[float]]:
    """The baseline b of each step: the mean of G over all steps of the batch in its bucket.

        b_t = mean{G_u : bucket(u) = bucket(t)}   if the bucket has at least 2 steps
        b_t = mean{G_u : all steps u of the batch}   otherwise

    ``returns[i][t]`` is G_t of trajectory i and ``buckets[i][t]`` its bucket.
    """
    if len(returns) != len(buckets) or any(
        len(g) != len(b) for g, b in zip(returns, buckets, strict=True)
    ):
        raise ValueError("bucket_baseline: returns and buckets must have the same shape")
    members: dict[str, list[float]] = defaultdict(list)
    for gs, bs in zip(returns, buckets, strict=True):
        for g, b in zip(gs, bs, strict=True):
            members[b].append(float(g))
    all_g = [g for gs in members.values() for g in gs]
    batch_mean = sum(all_g) / len(all_g) if all_g else 0.0
    mean = {b: sum(gs) / len(gs) if len(gs) > 1 else batch_mean for b, gs in members.items()}
    return [[mean[b] for b in bs] for bs in buckets]


def dense_advantages(
    step_rewards: Sequence[Sequence[float]],
    kinds: Sequence[Sequence[str]],
    c: float = 0.5,
    invalid_bucket: bool = True,
) -> list[list[float]]:
    """A_t = c * (G_t - b_t) for every step of a batch of trajectories.

    G_t is the reward-to-go of the step rewards s_t and b_t the position-bucket baseline
    (``bucket_baseline`` over ``position_buckets``). A trajectory with no steps gets [].
    """
    if len(step_rewards) != len(kinds):
        raise ValueError(
            f"dense_advantages: {len(step_rewards)} reward lists for {len(kinds)} kind lists"
        )
    returns = [reward_to_go(s) for s in step_rewards]
    buckets = [position_buckets(k, invalid_bucket) for k in kinds]
    baselines = bucket_baseline(returns, buckets)
    return [
        [c * (g - b) for g, b in zip(gs, bs, strict=True)]
        for gs, bs in zip(returns, baselines, strict=True)
    ]


def sparse_group_advantages(rewards: torch.Tensor, group_ids: Sequence[str]) -> torch.Tensor:
    """A_i = R_i - mean{R_j : group(j) = group(i)}, no std division; detached.

    Shapes: rewards [N], group_ids N ids -> advantages [N] in rewards' dtype.
    """
    if rewards.dim() != 1 or rewards.shape[0] != len(group_ids):
        raise ValueError(
            f"sparse_group_advantages: rewards must be [N] with N = {len(group_ids)} group ids; "
            f"got {tuple(rewards.shape)}"
        )
    index_of: dict[str, int] = {}
    groups = torch.tensor(
        [index_of.setdefault(g, len(index_of)) for g in group_ids],
        dtype=torch.long,
        device=rewards.device,
    )  # [N]
    r = rewards.detach()  # [N]
    sums = r.new_zeros(len(index_of)).index_add_(0, groups, r)  # [G]
    counts = r.new_zeros(len(index_of)).index_add_(0, groups, torch.ones_like(r))  # [G]
    return r - (sums / counts)[groups]


@dataclass
class DenseAdvantages:
    """ARCO's dense estimator as a part: A_t = c·(G_t − b_bucket) (``dense_advantages``) from a
    step scorer's ``step_scores``, placed on each step's sampled tokens (per-token lists,
    ``common.rewards.spread_to_tokens``). It reads the trainer's ``step_layout`` in
    ``rewards.extras`` (``step_kinds``, ``step_tokens``, ``response_tokens``). The bucket
    baselines are over the batch this process holds; ARCO's own trainer gathers every rank's
    batch first (``global_dense_advantages``)."""

    needs_step_scores: ClassVar[bool] = True
    c: float = 0.5
    invalid_bucket: bool = True

    def __call__(
        self,
        rewards: Rewards,
        group_ids: Sequence[str],
        step_scores: list[list[float]] | None = None,
    ) -> list[list[float]]:
        if step_scores is None:
            raise ValueError("DenseAdvantages needs step_scores: one s_t per agent step")
        missing = [k for k in LAYOUT if k not in rewards.extras]
        if missing:
            raise ValueError(
                f"DenseAdvantages needs rewards.extras[{', '.join(map(repr, missing))}] "
                "(common.rewards.step_layout of the step's trajectories)"
            )
        if len(step_scores) != len(group_ids):
            raise ValueError(
                f"DenseAdvantages: {len(step_scores)} score lists for {len(group_ids)} trajectories"
            )
        extras = rewards.extras
        per_step = dense_advantages(step_scores, extras["step_kinds"], self.c, self.invalid_bucket)
        return spread_to_tokens(per_step, extras["step_tokens"], extras["response_tokens"])


def sparse_group(
    rewards: Rewards, group_ids: Sequence[str], step_scores: list[list[float]] | None = None
) -> torch.Tensor:
    """ARCO's sparse estimator as a part: A_i = R_i − group mean (``sparse_group_advantages``)."""
    return sparse_group_advantages(rewards.values, group_ids)
