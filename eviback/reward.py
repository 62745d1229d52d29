"""EviBack's reward: the actor-first gate, the teacher backoff for all-zero groups, and the
λ-scaled group advantages.

For a group of n rollouts of one question:

- actor first: if any EM_i = 1, r_i = EM_i for all i (no teacher, advantage scale 1);
- all-zero group: r_i = β·supported_i + γ·eligible_i·F1_i, and r_i = 0 without search evidence
  (advantage scale λ).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from common.metrics import exact_match, f1_score
from common.rl import group_normalized_advantages
from eviback.teacher import Verdict

if TYPE_CHECKING:
    from common.rollout.trajectory import Trajectory


@dataclass(frozen=True)
class RolloutFacts:
    """What the reward needs to know about a rollout besides its EM and its verdict."""

    has_evidence: bool  # some search returned at least one document
    well_formed: bool  # no invalid turn
    answered: bool  # ended with a non-empty answer


def rollout_facts(trajectory: Trajectory) -> RolloutFacts:
    return RolloutFacts(
        has_evidence=any(s.kind == "search" and s.shown_docs for s in trajectory.steps),
        well_formed=trajectory.num_invalid == 0,
        answered=bool(trajectory.answer and trajectory.answer.strip())
        and not trajectory.forced_terminated,
    )


def actor_em(trajectory: Trajectory, well_formed_only: bool = True) -> float:
    """The actor's own reward: EM of its answer against the gold answers. With
    ``well_formed_only`` (the release) the answer counts only from a well-formed trajectory (no
    invalid turn, ended with an answer): a malformed but correct rollout earns 0."""
    facts = rollout_facts(trajectory)
    if well_formed_only and not (facts.well_formed and facts.answered):
        return 0.0
    return exact_match(trajectory.answer, trajectory.golden_answers)


def is_supported(verdict: Verdict | None) -> bool:
    """supported = 1[the merged verdict is valid and its status is S or A]."""
    return verdict is not None and verdict.valid and verdict.status in ("S", "A")


def is_eligible(verdict: Verdict | None, facts: RolloutFacts) -> bool:
    """eligible = supported ∧ the trajectory is well formed and answered ∧ the teacher's answer
    is non-empty."""
    return (
        is_supported(verdict)
        and facts.well_formed
        and facts.answered
        and bool(verdict is not None and verdict.answer.strip())
    )


def teacher_f1(verdict: Verdict | None, golden_answers: Sequence[str]) -> float:
    """F1(teacher answer, gold): max token F1 over the gold answers (0 without a valid answer)."""
    if verdict is None or not verdict.valid:
        return 0.0
    return f1_score(verdict.answer, golden_answers)


def backoff_reward(supported: bool, eligible: bool, f1: float, beta: float, gamma: float) -> float:
    """r = β·supported + γ·eligible·F1."""
    return beta * float(supported) + gamma * float(eligible) * f1


def group_rewards(
    em: Sequence[float],
    supported: Sequence[bool],
    eligible: Sequence[bool],
    f1: Sequence[float],
    has_evidence: Sequence[bool],
    beta: float = 0.1,
    gamma: float = 0.1,
) -> tuple[list[float], bool]:
    """Rewards [n] of one group and whether it fell back to the teacher.

    If any EM_i = 1: r_i = EM_i. Else r_i = β·supported_i + γ·eligible_i·F1_i where rollout i has
    evidence, 0 where it has none; fell_back = True.
    """
    n = len(em)
    for name, xs in (("supported", supported), ("eligible", eligible), ("f1", f1)):
        if len(xs) != n:
            raise ValueError(f"{name} has {len(xs)} entries for a group of {n} rollouts")
    if len(has_evidence) != n:
        raise ValueError(
            f"has_evidence has {len(has_evidence)} entries for a group of {n} rollouts"
        )
    for i in range(n):
        if em[i] not in (0, 1):
            raise ValueError(f"rollout {i}: EM must be 0 or 1, got {em[i]}")
        if not 0.0 <= f1[i] <= 1.0:
            raise ValueError(f"rollout {i}: F1 must lie in [0, 1], got {f1[i]}")
        if eligible[i] and not supported[i]:
            raise ValueError(f"rollout {i}: eligible but not supported")
    if any(e == 1 for e in em):
        return [float(e) for e in em], False
    rewards = [
        backoff_reward(supported[i], eligible[i], f1[i], beta, gamma) if has_evidence[i] else 0.0
        for i in range(n)
    ]
    return rewards, True


def scaled_group_advantages(
    rewards: Tensor | Sequence[float],
    group_ids: Sequence,
    scales: Tensor | Sequence[float],
    eps: float = 1e-6,
) -> Tensor:
    """A_i = s_g · (r_i − mean_g) / (std_g + ε), std with ddof = 1, s_g the group's scale (λ for
    a fallback group, 1 otherwise). λ scales after normalisation, which would cancel a reward
    scale. A one-member group has no spread to normalise by: A_i = s_g · r_i.

    rewards [N], group_ids N ids, scales [N] constant within each group -> [N].
    """
    rewards = torch.as_tensor(rewards)
    rewards = rewards if rewards.is_floating_point() else rewards.float()
    scales = torch.as_tensor(scales, dtype=rewards.dtype)
    ids = list(group_ids)
    if scales.shape != rewards.shape or len(ids) != rewards.numel():
        raise ValueError(
            f"rewards {tuple(rewards.shape)}, scales {tuple(scales.shape)} and {len(ids)} "
            "group ids must have the same length"
        )
    scale_of: dict = {}
    size: dict = {}
    for g, s in zip(ids, scales.tolist(), strict=True):
        if scale_of.setdefault(g, s) != s:
            raise ValueError(
                f"group {g!r} has more than one advantage scale: {scale_of[g]} and {s}"
            )
        size[g] = size.get(g, 0) + 1
    advantages = group_normalized_advantages(rewards, ids, eps=eps, ddof=1)  # [N]
    alone = torch.tensor([size[g] == 1 for g in ids], dtype=torch.bool)  # [N]
    return torch.where(alone, rewards, advantages) * scales


def fallback_advantage_share(advantages: Tensor, fell_back: Sequence[bool]) -> float:
    """The backoff's share of the update's signal: Σ|A_i| over rollouts of fallback (all-zero)
    groups over Σ|A_i| over all rollouts; 0 when every advantage is 0."""
    a = advantages.detach().abs().float()
    mask = torch.tensor(list(fell_back), dtype=torch.bool)
    total = a.sum().item()
    return a[mask].sum().item() / total if total > 0 else 0.0
