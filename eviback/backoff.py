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
verdicts over as ``ctx.teacher``, a ``TeacherVerdicts``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from common.rewards import Group, OutcomeReward, RewardContext, Rewards, context_part
from common.rollout import Trajectory
from eviback.config import EviBackRewardConfig, TeacherConfig
from eviback.reward import (
    actor_em,
    group_rewards,
    is_eligible,
    is_supported,
    rollout_facts,
    scaled_group_advantages,
    teacher_f1,
)
from eviback.teacher import Judgement, TeacherStats


@dataclass
class Backoff:
    """Rewards and advantage scales of a batch of groups, with what the teacher said."""

    rewards: torch.Tensor  # [N]
    scales: torch.Tensor  # [N]
    em: list[float]
    fell_back: list[bool]  # the rollout's group fell back to the teacher
    judgements: list[Judgement | None]  # None where the teacher was not asked
    stats: TeacherStats
    all_zero_groups: int
    groups: int
    missing_groups: int = 0  # all-zero groups left at EM: a verdict of theirs failed to come


def backoff_rewards(
    trajs: Sequence[Trajectory],
    judged: Sequence[Judgement | None],
    stats: TeacherStats,
    cfg: TeacherConfig | None,
    em_gate: bool = True,
) -> Backoff:
    """EM for groups with a correct rollout; for all-zero groups ``group_rewards`` gives
    r_i = β·supported_i + γ·eligible_i·F1(teacher answer_i, gold), scale λ. ``cfg`` None (no
    teacher): EM, scale 1. ``em_gate``: EM counts only from a well-formed trajectory
    (``actor_em``), so a malformed correct rollout earns 0 and leaves its group all-zero.

    A failed verdict (``Verdict.failed``: no answer after the retries, a reply from another
    model, or one that broke the verdict contract however often asked) is a missing verdict, not
    "insufficient evidence" and not a zero beside its group's judged rollouts: its group is
    rewarded as if the teacher were off for it (EM, scale 1; all-zero, so it moves nothing) and
    counted in ``missing_groups``. A failed stage B alone leaves stage A's verdict (merge rule
    3); a dead stage B stops the run (``eviback.trainer.check_teacher_failures``).
    """
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(trajs):
        groups.setdefault(t.group_id, []).append(i)
    em = [actor_em(t, em_gate) for t in trajs]
    facts = [rollout_facts(t) for t in trajs]
    all_zero = [g for g, idx in groups.items() if not any(em[i] for i in idx)]
    rewards, scales, fell_back = list(em), [1.0] * len(trajs), [False] * len(trajs)
    missing = 0
    if cfg is not None:
        for idx in groups.values():
            final = [judged[i].final if judged[i] else None for i in idx]
            if any(v is not None and v.failed for v in final):
                missing += 1  # the teacher off for this group: EM, scale 1
                continue
            r, fb = group_rewards(
                [em[i] for i in idx],
                [is_supported(v) for v in final],
                [is_eligible(v, facts[i]) for v, i in zip(final, idx, strict=True)],
                [teacher_f1(v, trajs[i].golden_answers) for v, i in zip(final, idx, strict=True)],
                [facts[i].has_evidence for i in idx],
                cfg.beta,
                cfg.gamma,
            )
            for k, i in enumerate(idx):
                rewards[i], fell_back[i], scales[i] = r[k], fb, cfg.lam if fb else 1.0
    return Backoff(
        torch.tensor(rewards, dtype=torch.float32),
        torch.tensor(scales, dtype=torch.float32),
        em,
        fell_back,
        list(judged),
        stats,
        len(all_zero),
        len(groups),
        missing,
    )


def backoff_metrics(b: Backoff) -> dict[str, float]:
    """The per-step teacher log: all-zero share, calls, verdict mix, backoff reward, cost."""
    s = b.stats
    judged = max(s.items, 1)
    fallback = [r for r, fb in zip(b.rewards.tolist(), b.fell_back, strict=True) if fb]
    return {
        "all_zero_share": b.all_zero_groups / max(b.groups, 1),
        "teacher/items": s.items,
        "teacher/calls": s.calls,
        "teacher/S": s.supported / judged,
        "teacher/I": s.insufficient / judged,
        "teacher/A": s.ambiguous / judged,
        "teacher/invalid": s.invalid / judged,
        "teacher/failures": s.failures,
        "teacher/broken": s.broken,
        "teacher/wrong_model": s.wrong_model,
        "teacher/failure_share": s.failure_share,
        "teacher/failure_share_a": s.failure_share_a,
        "teacher/failure_share_b": s.failure_share_b,
        "teacher/missing_groups": b.missing_groups,
        "teacher/tokens": s.prompt_tokens + s.completion_tokens,
        "teacher/latency_s": s.latency_s,
        "backoff_reward_mean": sum(fallback) / len(fallback) if fallback else 0.0,
    }


@dataclass
class TeacherVerdicts:
    """The teacher's part of a step's reward context (``ctx.teacher``): ``judgements``, one per
    trajectory (None where the teacher was not asked), its ``stats``, ``em_gate``
    (``em_well_formed``) and the teacher's config (``config``; None when the teacher is off:
    every reward stays EM)."""

    judgements: Sequence[Judgement | None]
    stats: TeacherStats
    em_gate: bool = True
    config: TeacherConfig | None = None


def teacher_backoff_reward(groups: Sequence[Group], ctx: RewardContext) -> Rewards:
    """``backoff_rewards`` of the step's groups; metrics ``backoff_metrics``, extras
    ``advantage_scale`` [N] and the whole ``backoff`` record (for the samples written)."""
    trajs = [t for g in groups for t in g.trajectories]
    v = context_part(ctx, "teacher", TeacherVerdicts, "reward.fn=eviback (the teacher backoff)")
    b = backoff_rewards(trajs, v.judgements, v.stats, v.config, v.em_gate)
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


def reward_of(cfg: EviBackRewardConfig) -> OutcomeReward:
    """The run's outcome reward: ``reward.fn``, or with ``reward.base`` the backoff over it."""
    base = cfg.base_fn()
    return BackoffOver(base) if base is not None else cfg.reward_fn()
