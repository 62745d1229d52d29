"""CER as the search agent's outcome reward: ``reward.fn=cer.rewards.search_agent:AgentCER``.

The agent's answer given its trajectory: π(a* | trajectory) in place of π(a* | solution). For
trajectory j of a group (search GRPO, EviBack: the ``search_r1`` protocol) the scored prefix is
its own ids, never re-tokenized: the prompt, then the response (sampled turns and the inserted
observations, as they were inserted) up to where its answer starts inside the last
``<answer>…</answer>`` of its answer turn. The response is decoded once into emission groups
(``cer.rewards.answer.emission_groups``), as ``cer.rewards.answer`` cuts a boxed answer: a token that straddles
the answer's start (``" Paris"`` after ``<answer>``) is left out of the prefix and its text before
the answer is carried in a ``tail`` (here ``" "``). Every answer x scored after s_j is
``encode(tail + x + closing)``, re-encoded on its own (``cer.rewards.answer.continuation_ids``), with
``closing`` the trajectory's own text from its answer's end to the end of ``</answer>``
(``" </answer>"``), so that π("Paris" | s_j) is the probability of the answer "Paris", not of
every answer starting with it. When the continuation's last token ends where the closing does
(``">"``, or a token holding the whole closing), that step sums over every token starting with
its text (``">\\n"``, ``">."``): the tag is closed as well (``closing_alternatives``).

A trajectory without an answer gets reward 0 and still serves as a solution s_j (as in CER):
its whole visible response, then ``tail = "<answer> "`` and ``closing = " </answer>"``.

Gold aliases: π(a* | s_j) is the *sum* over the distinct gold forms (the golden answers, then
the group's aliases; a* first) of π(x | s_j): the probability that the agent writes some gold
form. The forms are disjoint events (each continuation ends with the closing tag), so the sum is
a probability; with one golden answer it is π(a* | s_j) itself. ``aliases="first"`` scores the
first golden answer alone.

R_k = Σ_j π(a_k|s_j) π(a*|s_j) / Σ_j π(a_k|s_j) over all G trajectories of the group
(``cer.rewards.expectation.cer_from_logprobs``), the scores filled by ``cer.rewards.scoring.group_pairs`` and one call
of the scorer: ``ctx.scoring.score_fn`` when given, else ``cer.rewards.scoring.hf_prefix_scorer`` on the
live policy ``ctx.policy`` (with ``sync_ranks`` when it is ZeRO-3 partitioned over several
ranks: every rank then makes the same number of forwards, as ``cer.trainer.make_score_fn``), in
eval mode under no grad.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch

from cer.rewards.answer import AnswerSplit, backend_tokenizer, emission_groups, tokens_starting_with
from cer.rewards.expectation import cer_from_logprobs
from cer.rewards.groups import CERScoring
from cer.rewards.scoring import GroupPairs, ScoreFn, group_pairs, hf_prefix_scorer
from common.rewards import Group, RewardContext, Rewards, context_part
from common.rollout.trajectory import Trajectory

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)  # SearchR1Protocol's answer pattern
NO_ANSWER_TAIL, NO_ANSWER_CLOSING = "<answer> ", " </answer>"


def agent_split(traj: Trajectory, tokenizer: Any) -> AnswerSplit:
    """Trajectory ``traj`` cut at its answer (module docstring): ``solution_ids`` = prompt ids +
    response ids before the answer, the ``tail``, the ``answer`` (None without one) and the
    ``closing`` text; ``answer_ids``/``closing_ids`` the response tokens over them."""
    ids = list(traj.response_ids)
    text, groups = emission_groups(ids, tokenizer)
    step = next((s for s in reversed(traj.steps) if s.kind == "answer"), None)
    span = None if traj.answer is None or step is None else _answer_span(text, groups, step)
    if span is None:
        visible_end = max((g[1] for g in groups if g[3] > g[2]), default=0)
        return AnswerSplit(
            list(traj.prompt_ids) + ids[:visible_end],
            NO_ANSWER_TAIL,
            None,
            [],
            NO_ANSWER_CLOSING,
            [],
        )
    start, end, closing_end = span
    cut = next(g for g in groups if g[3] > start)

    def overlapping(lo: int, hi: int) -> list[int]:
        return [t for g in groups if g[2] < hi and g[3] > lo for t in ids[g[0] : g[1]]]

    return AnswerSplit(
        solution_ids=list(traj.prompt_ids) + ids[: cut[0]],
        tail=text[cut[2] : start],
        answer=text[start:end],
        answer_ids=overlapping(start, end),
        closing=text[end:closing_end],
        closing_ids=overlapping(end, closing_end),
    )


def _answer_span(
    text: str, groups: list[tuple[int, int, int, int]], step: Any
) -> tuple[int, int, int] | None:
    """(answer start, answer end, closing end) in ``text`` of the answer step's last non-empty
    ``<answer>…</answer>`` (the one ``SearchR1Protocol.parse`` takes), stripped; None if absent."""
    inside = [g for g in groups if g[0] >= step.start and g[1] <= step.end]
    if not inside:
        return None
    lo, hi = inside[0][2], inside[-1][3]
    found = [m for m in ANSWER.finditer(text, lo, hi) if m.group(1).strip()]
    if not found:
        return None
    m = found[-1]
    raw = m.group(1)
    start = m.start(1) + len(raw) - len(raw.lstrip())
    return start, start + len(raw.strip()), m.end()


def closing_alternatives(
    split: AnswerSplit, continuation: list[int], tokenizer: Any
) -> tuple[int, ...] | None:
    """The tokens that close the tag as well as the continuation's last one, or None: when that
    token ends where the closing text ends (it lies inside ``</answer>``'s end, ``">"``, or holds
    the whole closing), every token starting with its text. ``cer.rewards.answer.closing_alternatives``
    for a closing of several characters."""
    if not split.closing or not continuation:
        return None
    last = backend_tokenizer(tokenizer).decode([continuation[-1]])
    if not last or not (last.endswith(split.closing) or split.closing.endswith(last)):
        return None
    return tokens_starting_with(tokenizer, last)


def gold_forms(group: Group, aliases: str = "sum") -> list[str]:
    """The reference forms whose probabilities are summed: a* (the first golden answer) first,
    then the other distinct golden answers and aliases (``aliases="sum"``), or a* alone."""
    forms = list(dict.fromkeys(group.golden_answers + group.aliases))
    return forms if aliases == "sum" else forms[:1]


def agent_pairs(
    group: Group, tokenizer: Any, aliases: str = "sum"
) -> tuple[GroupPairs, list[GroupPairs]]:
    """The group's pairs: a* and every distinct answer after each trajectory
    (``cer.rewards.scoring.group_pairs``, all G solutions), then one ``GroupPairs`` per other gold form
    (that form alone after each trajectory). The closing alternatives are this module's."""
    if not group.golden_answers:
        raise ValueError(f"AgentCER: question {group.question!r} has no golden answer")
    splits = [agent_split(t, tokenizer) for t in group.trajectories]
    forms = gold_forms(group, aliases)
    main = group_pairs([], splits, forms[0], tokenizer)
    bare = [replace(s, answer=None) for s in splits]
    others = [group_pairs([], bare, x, tokenizer) for x in forms[1:]]
    for p in (main, *others):
        per_row = len(p.candidates)
        p.alternatives = [
            closing_alternatives(splits[p.rows[i // per_row]], cont, tokenizer)
            for i, cont in enumerate(p.continuations)
        ]
    return main, others


def _partitioned(model: torch.nn.Module) -> bool:
    dist = torch.distributed
    several = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    return several and any(hasattr(p, "ds_id") for p in model.parameters())


@dataclass(frozen=True)
class AgentCER:
    """CER of each trajectory's answer given the group's trajectories (module docstring), an
    ``OutcomeReward``. Metrics: ``cer/ref_prob_mean`` (mean over groups of mean_j π(a*|s_j)),
    ``cer/ref_prob_max`` (of max_j), ``cer/distinct_answers`` (per group)."""

    aliases: Literal["sum", "first"] = "sum"
    batch_size: int = 32

    def given_scorer(self, ctx: RewardContext) -> ScoreFn | None:
        """The run's scorer (``ctx.scoring``, a ``CERScoring``), if it gives one."""
        scoring = context_part(ctx, "scoring", CERScoring, "AgentCER", CERScoring())
        return scoring.score_fn

    def score_fn(self, ctx: RewardContext) -> ScoreFn:
        """The run's scorer (``ctx.scoring``), else the prefix scorer on the live policy."""
        given = self.given_scorer(ctx)
        if given is not None:
            return given
        if ctx.policy is None:
            raise ValueError("AgentCER needs ctx.policy (the model that scores) or a score_fn")
        return hf_prefix_scorer(ctx.policy, self.batch_size, sync_ranks=_partitioned(ctx.policy))

    def __call__(self, groups: Sequence[Group], ctx: RewardContext) -> Rewards:
        built = [agent_pairs(g, ctx.tokenizer, self.aliases) for g in groups]
        flat = [p for main, others in built for p in (main, *others)]
        score_fn = self.score_fn(ctx)
        # the live policy scores in eval mode (no dropout; gradient checkpointing would drop the
        # caches), its mode restored after
        policy = ctx.policy if self.given_scorer(ctx) is None else None
        was_training = policy is not None and policy.training
        if was_training:
            policy.eval()
        try:  # one call for the whole step (under sync_ranks each rank makes one)
            scores = score_fn(
                [x for p in flat for x in p.prefixes],
                [x for p in flat for x in p.continuations],
                [x for p in flat for x in p.alternatives],
            )
        finally:
            if was_training:
                policy.train()
        values, ref_probs, distinct, pos = [], [], [], 0
        for main, others in built:
            matrices = []
            for p in (main, *others):
                matrices.append(p.matrices(scores[pos : pos + len(p.prefixes)]))
                pos += len(p.prefixes)
            ref_logp = torch.logsumexp(torch.stack([m[0] for m in matrices]), 0)  # [G]
            _, answer_logp, answer_of_sample, answers = matrices[0]
            values.append(cer_from_logprobs(ref_logp, answer_logp, answer_of_sample).float())
            ref_probs.append(ref_logp.exp())
            distinct.append(len(answers))
        metrics = {
            "cer/ref_prob_mean": torch.stack([r.mean() for r in ref_probs]).mean().item(),
            "cer/ref_prob_max": torch.stack([r.max() for r in ref_probs]).mean().item(),
            "cer/distinct_answers": sum(distinct) / len(distinct),
        }
        return Rewards(torch.cat(values), metrics)
