"""VeriFree's update as published: the sample's answer replaced by the reference, and the gradient
of the reference's probability trained along with the reasoning.

VeriFree maximises ``J = E_{s ~ pi(s|q)} [pi(a* | q, s)]``, whose gradient is

    grad J = E_s [ R(s) grad log pi(s | q) + grad pi(a* | q, s) ],   R(s) = pi(a* | q, s)
           = E_s [ A(s) grad log pi(s | q) + R(s) grad log pi(a* | q, s) ]

(with a baseline on the first term: here CER's RLOO advantage ``A``). So each sample with an
answer is trained as ``prompt + solution + reference``: its solution tokens with advantage ``A_k``,
the reference tokens (``cer.rewards.answer.continuation_ids``: tail + a* + closing brace, what CER scores)
with weight ``R_k`` (detached). A sample without an answer has reward 0 and is trained as sampled,
with its advantage on every token. Under ``loss.aggregation: seq_mean_token_sum`` (CER's) the
loss's gradient is exactly the estimate above, averaged over the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from cer.rewards.answer import continuation_ids
from cer.rewards.groups import Group
from common.rollout.trajectory import Trajectory


def verifree_batch(
    groups: Sequence[Group], rewards: torch.Tensor, advantages: torch.Tensor, tokenizer: Any
) -> tuple[list[Trajectory], list[list[float]]]:
    """The trajectories VeriFree trains on (one per sample, group after group) and their per-token
    advantages; ``rewards`` [N]: ``pi(a* | s_k)`` (0 without an answer), ``advantages`` [N].

    The reference tokens are not sampled: they carry ``loss_mask`` 1 (they are trained) and a
    sampling logprob of 0 (the clipped loss does not read it)."""
    samples = [(g, k) for g in groups for k in range(len(g.trajs))]
    if not len(samples) == len(rewards) == len(advantages):
        raise ValueError(
            f"verifree_batch: {len(samples)} samples, {len(rewards)} rewards, "
            f"{len(advantages)} advantages"
        )
    trajs, values = [], []
    for (g, k), r, a in zip(samples, rewards.tolist(), advantages.tolist(), strict=True):
        t, split = g.trajs[k], g.splits[k]
        if split.answer is None:
            trajs.append(t)
            values.append([a] * len(t.response_ids))
            continue
        n = len(split.solution_ids)
        reference = continuation_ids(split, g.example.answer, tokenizer)
        new = Trajectory(
            t.group_id, t.sample_index, t.question_id, t.question, t.golden_answers, t.prompt_ids
        )
        new.append(list(t.response_ids[:n]), sampled=True, logprobs=t.sampling_logprobs[:n])
        new.append(reference, sampled=True, logprobs=[0.0] * len(reference))
        new.answer, new.done = g.example.answer, True
        trajs.append(new)
        values.append([a] * n + [r] * len(reference))
    return trajs, values
