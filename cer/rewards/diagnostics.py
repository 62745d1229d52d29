"""What a CER user needs to judge the reward's signal, step by step.

CER rewards a sample with the policy's own probability of the reference answer after the
group's solutions. Whether that trains anything depends on two things the rewards alone do not
show: whether the policy gives the reference more probability after the solutions the oracle
calls right than after the wrong ones (``ref_prob_right`` against ``ref_prob_wrong``, and the
reward's AUC against the oracle's verdict), and how large the advantages it makes are beside
another reward's (``abs_adv``). The AUC is taken within groups, where the advantages compare
samples: over every pair of a right and a wrong sample of the same group, the share the reward
orders right above wrong (ties count one half).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

AdvantageFn = Callable[[torch.Tensor, list[str]], torch.Tensor]


def within_group_auc(
    scores: torch.Tensor, verdict: torch.Tensor, group_ids: Sequence[str]
) -> tuple[float, int]:
    """Over all (right i, wrong j) pairs of samples in the same group: the sum of
    ``[s_i > s_j] + 0.5 [s_i == s_j]`` and the number of pairs (AUC = sum / pairs; no pair when
    no group has both a right and a wrong sample). Shapes [N], [N] (bool), N ids."""
    if not scores.shape == verdict.shape == (len(group_ids),):
        raise ValueError(
            f"within_group_auc: scores {tuple(scores.shape)}, verdict {tuple(verdict.shape)} and "
            f"{len(group_ids)} group ids must all be [N]"
        )
    members: dict[str, list[int]] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    right = verdict.bool()
    concordant, pairs = 0.0, 0
    for idx in members.values():
        s, r = scores[idx].double(), right[idx]
        hi, lo = s[r], s[~r]
        if hi.numel() and lo.numel():
            diff = hi[:, None] - lo[None, :]
            concordant += ((diff > 0).double() + 0.5 * (diff == 0).double()).sum().item()
            pairs += diff.numel()
    return concordant, pairs


def signal_metrics(
    rewards: Mapping[str, torch.Tensor],
    verdict: torch.Tensor,
    ref_prob: torch.Tensor | None,
    group_ids: Sequence[str],
    advantage_fn: AdvantageFn,
) -> dict[str, float]:
    """``signal/*`` for one step's samples (all ranks'): ``ref_prob_right`` / ``ref_prob_wrong``
    (mean pi(a* | s_k) over the scored solutions the oracle calls right / wrong, NaN entries of
    ``ref_prob`` are unscored; a key is absent when no such solution) with their counts,
    ``mixed_pairs`` (right-wrong pairs within groups), per reward type but the oracle's own
    (``rule``) ``auc/<type>`` (absent without a pair) and ``abs_adv/<type>`` (mean |advantage|
    under ``advantage_fn``)."""
    right = verdict.bool()
    out: dict[str, float] = {}
    if ref_prob is not None:
        scored = ~torch.isnan(ref_prob)
        for name, side in (("right", right), ("wrong", ~right)):
            values = ref_prob[scored & side]
            out[f"signal/ref_prob_{name}_n"] = float(values.numel())
            if values.numel():
                out[f"signal/ref_prob_{name}"] = values.double().mean().item()
    _, pairs = within_group_auc(verdict.double(), verdict, group_ids)
    out["signal/mixed_pairs"] = float(pairs)
    ids = list(group_ids)
    for kind, r in rewards.items():
        if kind != "rule" and pairs:
            out[f"signal/auc/{kind}"] = within_group_auc(r, verdict, ids)[0] / pairs
        out[f"signal/abs_adv/{kind}"] = advantage_fn(r.double(), ids).abs().mean().item()
    return out
