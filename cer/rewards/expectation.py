"""The conditional expectation reward (CER) and the rewards it is compared with, on tensors.

All functions return detached tensors: a reward carries no gradient.
"""

from __future__ import annotations

import torch

SELECTIONS = ("per_answer", "first")


def select_solutions(
    answer_of_sample: torch.Tensor, n_answers: int, m: int | None, rule: str = "per_answer"
) -> torch.Tensor:
    """Which of a group's G solutions CER averages over for each of its U distinct answers, when
    only ``m`` of them count: a bool mask [G, U] (all True when ``m`` is None or at least G).

    ``per_answer`` (the public release's choice): for answer u, the first ``m`` solutions that
    produced u, in sample order, then, when fewer than ``m`` did, the first of the others.
    ``first``: the first ``m`` solutions of the group for every answer.
    """
    if rule not in SELECTIONS:
        raise ValueError(f"select_solutions: rule must be one of {SELECTIONS}; got {rule!r}")
    g = answer_of_sample.shape[0]
    if m is None or m >= g:
        return torch.ones(g, n_answers, dtype=torch.bool)
    if m < 1:
        raise ValueError(f"select_solutions: m must be at least 1 (or None for all); got {m}")
    mask = torch.zeros(g, n_answers, dtype=torch.bool)
    if rule == "first":
        mask[:m] = True
        return mask
    for u in range(n_answers):
        own = [j for j in range(g) if answer_of_sample[j] == u]
        others = [j for j in range(g) if answer_of_sample[j] != u]
        mask[(own + others)[:m], u] = True
    return mask


def cer_from_logprobs(
    ref_logp: torch.Tensor,
    answer_logp: torch.Tensor,
    answer_of_sample: torch.Tensor,
    m: int | None = None,
    counted: torch.Tensor | None = None,
) -> torch.Tensor:
    """CER of each sample of a group, from the scored log probabilities.

        R_k = sum_j pi(a_k | s_j) pi(a* | s_j) / sum_j pi(a_k | s_j)
        log R_k = logsumexp_j(L0_j + Lk_j) - logsumexp_j(Lk_j)

    with ``L0_j = ref_logp[j] = log pi(a* | s_j)`` and ``Lk_j = answer_logp[j, u_k]``, ``u_k =
    answer_of_sample[k]`` the index of sample k's distinct answer (-1: no answer, reward 0). The
    sum runs over the first ``m`` solutions (all when None), and for answer u over the solutions
    j with ``counted[j, u]`` only when that bool mask [J, U] is given (``select_solutions``).

    Shapes: ref_logp [J], answer_logp [J, U], answer_of_sample [G] (long) -> rewards [G] in
    [0, 1], in ref_logp's dtype. An answer with probability 0 after every solution (all its Lk_j
    = -inf) gets reward 0, not NaN.
    """
    if ref_logp.dim() != 1 or answer_logp.dim() != 2 or answer_logp.shape[0] != ref_logp.shape[0]:
        raise ValueError(
            f"cer_from_logprobs: ref_logp must be [J] and answer_logp [J, U]; got "
            f"{tuple(ref_logp.shape)} and {tuple(answer_logp.shape)}"
        )
    n_answers = answer_logp.shape[1]
    if (
        answer_of_sample.dim() != 1
        or not ((answer_of_sample >= -1) & (answer_of_sample < n_answers)).all()
    ):
        raise ValueError(
            f"cer_from_logprobs: answer_of_sample must be [G] with entries in [-1, {n_answers}); "
            f"got {answer_of_sample.tolist()}"
        )
    if m is not None and m < 1:
        raise ValueError(f"cer_from_logprobs: m must be at least 1 (or None for all); got {m}")
    if torch.isnan(ref_logp).any() or torch.isnan(answer_logp).any():
        raise ValueError("cer_from_logprobs: NaN in the log probabilities")
    if counted is not None and counted.shape != answer_logp.shape:
        raise ValueError(
            f"cer_from_logprobs: counted must be [J, U] = {tuple(answer_logp.shape)}; got "
            f"{tuple(counted.shape)}"
        )
    with torch.no_grad():
        l0 = ref_logp[:m].double()  # [J]
        lk = answer_logp[:m].double()  # [J, U]
        if counted is not None:
            lk = lk.masked_fill(~counted[:m].to(lk.device), float("-inf"))
        log_num = torch.logsumexp(l0[:, None] + lk, dim=0)  # [U]
        log_den = torch.logsumexp(lk, dim=0)  # [U]
        reachable = log_den > float("-inf")
        per_answer = torch.where(reachable, (log_num - log_den).exp(), torch.zeros_like(log_den))
        # Log probabilities a hair above 0 (float round-off) must not lift a reward above 1.
        per_answer = per_answer.clamp(0.0, 1.0)
        # Index U is an appended 0: the reward of samples without an answer (-1).
        padded = torch.cat([per_answer, per_answer.new_zeros(1)])
        rewards = padded[torch.where(answer_of_sample >= 0, answer_of_sample, n_answers)]
    return rewards.to(ref_logp.dtype)


def verifree_reward(
    ref_logp_own: torch.Tensor, answer_of_sample: torch.Tensor | None = None
) -> torch.Tensor:
    """VeriFree's reward as a scalar: ``r_k = pi(a* | s_k) = exp(ref_logp_own[k])``, the
    probability of the reference answer after the sample's own solution (``score_group``'s
    ``ref_logp`` with every solution scored, ``m=None``); 0 for a sample without an answer
    (``answer_of_sample[k] == -1``), as in the release. Shapes [G] -> [G].

    The reward alone reinforces the reasoning only; VeriFree as published also trains the
    reference in place of the sample's answer, with weight ``pi(a* | s_k)``: ``cer.rewards.verifree``."""
    reward = ref_logp_own.detach().exp().clamp(0.0, 1.0)
    if answer_of_sample is not None:
        reward = torch.where(answer_of_sample.to(reward.device) >= 0, reward, 0.0)
    return reward


def combine_rule_cer(rule: torch.Tensor, cer: torch.Tensor) -> torch.Tensor:
    """``rule+cer``: 1 where the rule verifier accepts the answer, else its CER value.

    The paper reports this combination as its best without giving its form; this is the chosen
    one: a verified answer keeps the full reward, and CER grades only the answers the rule cannot
    confirm (free-form, unusual notation, wrong). Shapes [G] (rule: bool or 0/1) -> [G].
    """
    return torch.where(rule.bool(), torch.ones_like(cer), cer).detach()
