"""EviBack's reward and estimator as parts (``common.rewards``), what ``reward.fn=eviback`` and
``reward.advantage=backoff`` name:

- ``teacher_backoff_reward``: actor first (EM, from a well-formed trajectory only), the teacher's
  r_i = β·supported_i + γ·eligible_i·F1_i for an all-zero group (``backoff_rewards``), with the
  group's advantage scale (λ for a fallback group, 1 otherwise) in ``extras``;
- ``backoff_advantages``: A_i = s_g · (r_i − mean_g) / (std_g + ε), λ applied after
  normalisation (``scaled_group_advantages``);
- ``BackoffOver(base)``: the backoff over another outcome reward (``reward.base``, e.g. CER):
  a group that falls back takes the teacher's rewards and λ, every other group ``base``'s.

The trainer asks the teacher (during the rollouts, with ``teacher.overlap``) and hands its
verdicts over in ``ctx.extra``: ``judgements`` (one per trajectory, None where not asked),
``teacher_stats``, ``teacher`` (its ``TeacherConfig``, None when the teacher is off) and
``em_gate`` (``em_well_formed``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from common.rewards import Group, OutcomeReward, RewardContext, Rewards
from eviback.reward import scaled_group_advantages
from eviback.trainer import backoff_metrics, backoff_rewards


def teacher_backoff_reward(groups: Sequence[Group], ctx: RewardContext) -> Rewards:
    """``backoff_rewards`` of the step's groups; metrics ``backoff_metrics``, extras
    ``advantage_scale`` [N] and the whole ``backoff`` record (for the samples written)."""
    trajs = [t for g in groups for t in g.trajectories]
    x = ctx.extra
    b = backoff_rewards(trajs, x["judgements"], x["teacher_stats"], x["teacher"], x["em_gate"])
    return Rewards(b.rewards, backoff_metrics(b), {"advantage_scale": b.scales, "backoff": b})


def backoff_advantages(
    rewards: Rewards, group_ids: Sequence[str], step_scores: list[list[float]] | None = None
) -> Tensor:
    """λ-scaled group advantages; scale 1 where the reward gave none (``advantage_scale``)."""
    scales = rewards.extras.get("advantage_scale")
    if scales is None:
        scales = torch.ones_like(rewards.values, dtype=torch.float32)
    return scaled_group_advantages(rewards.values, group_ids, scales)


@dataclass
class BackoffOver:
    """EviBack's backoff over a base outcome reward (``reward.base``): a group falls back when
    no rollout is correct by EM (the paper's trigger, ``em_gate`` as configured) and the teacher
    is on; its rollouts take the teacher's r_i and the scale λ, as in ``teacher_backoff_reward``.
    Every other group, all-zero groups the teacher did not take included, keeps ``base``'s
    rewards (scale 1) in place of EM. Metrics: ``base``'s, then the backoff's."""

    base: OutcomeReward

    def __call__(self, groups: Sequence[Group], ctx: RewardContext) -> Rewards:
        out = teacher_backoff_reward(groups, ctx)
        b = out.extras["backoff"]
        base = self.base(groups, ctx)
        if base.values.shape != b.rewards.shape:
            raise ValueError(
                f"reward.base gave {tuple(base.values.shape)} rewards for {len(b.em)} rollouts"
            )
        fell_back = torch.tensor(b.fell_back, dtype=torch.bool)  # [N]
        values = torch.where(fell_back, b.rewards, base.values.to(b.rewards.dtype))  # [N]
        extras = {**base.extras, **out.extras, "backoff": replace(b, rewards=values)}
        return Rewards(values, {**base.metrics, **out.metrics}, extras)
