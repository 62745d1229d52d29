"""Every reward type for sampled groups: verifier checks, and CER's scoring batched over groups.

A ``Group`` is one prompt, its G sampled responses and their answer splits. ``group_rewards``
returns the rewards of the requested types over all samples (group after group) and, when a
scored type is among them, the CER matrix summary; ``scored_group_rewards`` also each group's
scores (``GroupScores``), and takes an earlier pass's instead of scoring those pairs again.
``GroupReward`` is one type as an outcome reward (``common.rewards``): ``EXACT``, ``RULE``,
``CER``, ``RULE_CER`` and ``VERIFREE``, what ``reward.fn`` (or ``reward.type``) names.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

from cer.data import MathExample
from cer.rewards.answer import AnswerSplit
from cer.rewards.expectation import cer_from_logprobs, combine_rule_cer, verifree_reward
from cer.rewards.scoring import GroupPairs, ScoreFn, group_pairs
from cer.rewards.verifiers import (
    alias_verifier,
    exact_verifier,
    letter_verifier,
    release_rule_verifier,
    rule_verifier,
    strict_choice_verifier,
)
from common import rewards as parts
from common.metrics import exact_match
from common.rollout.engine import GeneratedKV
from common.rollout.trajectory import Trajectory

if TYPE_CHECKING:
    from cer.config import RewardConfig

SCORED_TYPES = ("cer", "rule+cer", "verifree")
# not a reward: each sample's pi(a* | own solution) (NaN where its solution is not scored)
REF_PROB = "ref_prob"


@dataclass
class Group:
    """One prompt and its G samples (``trajs[k]`` and ``splits[k]`` are sample k)."""

    example: MathExample
    prompt_ids: list[int]
    trajs: list[Trajectory]
    splits: list[AnswerSplit]
    # each sample's generation cache when the engine kept it (HFEngine(keep_kv=True)), else None
    kvs: list[GeneratedKV | None] | None = None


@dataclass(frozen=True)
class Rules:
    """Which rule checks the math and the multiple-choice rows: ``math`` ``boxed`` (math-verify
    on the boxed answer) or ``last512`` (the release: math-verify on the response's last 512
    characters, no box needed); ``choice`` ``letter`` (the letter an answer names) or ``strict``
    (the release: the boxed answer is the letter itself)."""

    math: Literal["boxed", "last512"] = "boxed"
    choice: Literal["letter", "strict"] = "letter"


DEFAULT_RULES = Rules()


def rules_of(reward: RewardConfig) -> Rules:
    """The ``Rules`` of a run's reward settings (``math_verifier``, ``choice_verifier``)."""
    return Rules(reward.math_verifier, reward.choice_verifier)


def verifier_name(example: MathExample, rules: Rules = Rules()) -> str:
    """Which verifier is the rule for ``example``: ``alias`` (its row says ``verifier: alias``:
    the alias oracle over its ``answer_forms``), ``qa-em`` (a short-answer QA row: SQuAD-normalised
    exact match, ``common.metrics.exact_match``), ``letter`` or ``strict-choice`` (multiple
    choice), ``math-verify`` or ``math-verify-last512``."""
    if example.metadata.get("verifier") == "alias":
        return "alias"
    if example.metadata.get("verifier") == "qa":
        return "qa-em"
    if example.metadata.get("multiple_choice"):
        return "letter" if rules.choice == "letter" else "strict-choice"
    return "math-verify" if rules.math == "boxed" else "math-verify-last512"


def is_correct(
    answer: str | None, example: MathExample, response: str | None = None, rules: Rules = Rules()
) -> bool:
    """The rule verifier (``verifier_name``): the alias oracle for alias rows, letter match or
    strict equality for multiple choice, math-verify on the answer or on the response's end
    (``response``: the decoded response, needed by ``rules.math == "last512"``)."""
    name = verifier_name(example, rules)
    if name == "math-verify-last512":
        if response is None:
            raise ValueError("is_correct: the last512 math rule needs the response text")
        return release_rule_verifier(response, example.answer)
    if answer is None:
        return False
    if name == "alias":
        return alias_verifier(answer, example.metadata["answer_forms"])
    if name == "qa-em":
        return exact_match(answer, example.answer) == 1.0
    if name == "letter":
        return letter_verifier(answer, example.answer)
    if name == "strict-choice":
        return strict_choice_verifier(answer, example.answer)
    return rule_verifier(answer, example.answer)


def group_verdicts(group: Group, tokenizer: Any, rules: Rules = Rules()) -> list[bool]:
    """``is_correct`` for each sample of ``group`` (responses decoded only when the rule reads
    them)."""
    texts: list[str | None] = [None] * len(group.splits)
    if verifier_name(group.example, rules) == "math-verify-last512":
        texts = [tokenizer.decode(t.response_ids, skip_special_tokens=True) for t in group.trajs]
    return [
        is_correct(s.answer, group.example, text, rules)
        for s, text in zip(group.splits, texts, strict=True)
    ]


def is_exact(answer: str | None, example: MathExample) -> bool:
    """Normalised string match with the reference."""
    return answer is not None and exact_verifier(answer, example.answer)


def score_groups(
    score_fn: ScoreFn,
    groups: Sequence[Group],
    tokenizer: Any,
    m: int | None,
    selection: str = "first",
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[str]]]:
    """``score_group`` for every group with a single ``score_fn`` call carrying all pairs (the
    prefix scorer shares each prompt and solution across them; one request for an engine)."""
    pairs = [
        group_pairs(g.prompt_ids, g.splits, g.example.answer, tokenizer, m, g.kvs, selection)
        for g in groups
    ]
    return _scored(score_fn, pairs)


def _scored(
    score_fn: ScoreFn, pairs: Sequence[GroupPairs]
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[str]]]:
    flat = _token_logps(score_fn, pairs, None, False)
    return [p.matrices(lp) for p, lp in zip(pairs, flat, strict=True)]


@dataclass(frozen=True)
class GroupScores:
    """One group's scored pairs (``group_pairs``) and the scorer's per-token log probabilities
    of each (``token_logps[i]``: pair i's). ``every_solution``: the pass scored every sample's
    solution whatever the answers (VeriFree among its types, or ``m`` None or at least G), so a
    later pass over the same group finds each pair's scores here."""

    pairs: GroupPairs
    token_logps: list[list[float]]
    every_solution: bool


def _pair_key(p: GroupPairs, i: int) -> tuple:
    return tuple(p.prefixes[i]), tuple(p.continuations[i]), p.alternatives[i]


def _token_logps(
    score_fn: ScoreFn | None,
    pairs: Sequence[GroupPairs],
    known: Sequence[GroupScores] | None,
    covered: bool,
) -> list[list[list[float]]]:
    """Each group's per-pair token log probabilities: a pair of ``known[g]`` (the same group's
    earlier scores) is read from there, the others come from one ``score_fn`` call, in group
    order. ``covered`` (the earlier pass scored every solution): no call at all, the same on
    every rank (a collective scorer needs equal calls); else the call is made even when empty."""
    if known is not None and len(known) != len(pairs):
        raise ValueError(f"{len(known)} groups' scores given for {len(pairs)} groups")
    found = (
        [{_pair_key(k.pairs, i): lp for i, lp in enumerate(k.token_logps)} for k in known]
        if known is not None
        else [{} for _ in pairs]
    )
    out = [
        [found[g].get(_pair_key(p, i)) for i in range(len(p.prefixes))] for g, p in enumerate(pairs)
    ]
    missing = [(g, i) for g, row in enumerate(out) for i, lp in enumerate(row) if lp is None]
    if covered:
        if missing:
            raise RuntimeError(
                f"{len(missing)} pairs missing from scores said to cover every solution"
            )
        return out
    if score_fn is None:
        raise ValueError("scoring needs a score_fn")
    flat = score_fn(
        [pairs[g].prefixes[i] for g, i in missing],
        [pairs[g].continuations[i] for g, i in missing],
        [pairs[g].alternatives[i] for g, i in missing],
        [pairs[g].generated[i] for g, i in missing],
    )
    if len(flat) != len(missing):
        raise ValueError(f"score_fn returned {len(flat)} results for {len(missing)} pairs")
    for (g, i), lp in zip(missing, flat, strict=True):
        out[g][i] = lp
    return out


def group_rewards(
    types: Iterable[str],
    groups: Sequence[Group],
    score_fn: ScoreFn | None,
    tokenizer: Any,
    m: int | None = None,
    selection: str = "first",
    rules: Rules = Rules(),
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Rewards [N] (N = all samples, group by group) for each of ``types`` (``exact`` and
    ``rule`` always come along: they are cheap and are the accuracy), and the CER summary:
    ``cer/ref_prob_mean`` (mean over groups of mean_j pi(a*|s_j)), ``cer/ref_prob_max`` (mean
    over groups of max_j), ``cer/distinct_answers`` (per group, mean). With ``m`` < G, CER
    averages each answer over the ``m`` solutions ``selection`` picks (``select_solutions``).
    ``ref_prob`` among ``types`` (not a reward, for ``cer.rewards.diagnostics``) adds each sample's
    pi(a* | own solution), NaN where it is not scored (all are with ``verifree`` among them).
    ``scored_group_rewards`` also returns the scores, and takes earlier ones."""
    by_type, stats, _ = scored_group_rewards(
        types, groups, score_fn, tokenizer, m, selection, rules
    )
    return by_type, stats


def scored_group_rewards(
    types: Iterable[str],
    groups: Sequence[Group],
    score_fn: ScoreFn | None,
    tokenizer: Any,
    m: int | None = None,
    selection: str = "first",
    rules: Rules = Rules(),
    known: Sequence[GroupScores] | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, float], list[GroupScores] | None]:
    """``group_rewards``, and each group's ``GroupScores`` (None when no scored type is asked
    for). ``known[g]``: group g's scores from an earlier pass of the step (the reward's, for the
    groups written to ``samples/``); only the pairs they lack are scored, and none at all when
    they cover every solution: each pair's probability is computed once a step."""
    types = set(types) | {"exact", "rule"}
    samples = [(s.answer, g.example) for g in groups for s in g.splits]
    out = {
        "exact": torch.tensor([float(is_exact(a, ex)) for a, ex in samples]),
        "rule": torch.tensor(
            [float(v) for g in groups for v in group_verdicts(g, tokenizer, rules)]
        ),
    }
    stats: dict[str, float] = {}
    if not types & {*SCORED_TYPES, REF_PROB}:
        return out, stats, None
    covered = known is not None and all(k.every_solution for k in known)
    if score_fn is None and not covered:
        raise ValueError(
            f"reward types {sorted(types & {*SCORED_TYPES, REF_PROB})} need a score_fn"
        )
    # VeriFree needs pi(a* | s_k) after every sample's own solution: score all G then.
    everyone = "verifree" in types
    pairs = [
        group_pairs(
            g.prompt_ids, g.splits, g.example.answer, tokenizer, m, g.kvs, selection, everyone
        )
        for g in groups
    ]
    token_logps = _token_logps(score_fn, pairs, known, covered)
    scores = [
        GroupScores(p, lp, everyone or m is None or m >= len(g.splits))
        for g, p, lp in zip(groups, pairs, token_logps, strict=True)
    ]
    scored = [p.matrices(lp) for p, lp in zip(pairs, token_logps, strict=True)]
    cer = torch.cat(
        [
            cer_from_logprobs(r, a, idx, counted=p.counted).float()
            for (r, a, idx, _), p in zip(scored, pairs, strict=True)
        ]
    )
    out["cer"] = cer
    out["rule+cer"] = combine_rule_cer(out["rule"], cer)
    if everyone:
        out["verifree"] = torch.cat([verifree_reward(r, idx).float() for r, _, idx, _ in scored])
    if REF_PROB in types:
        own = []
        for g, (r, *_), p in zip(groups, scored, pairs, strict=True):
            column = torch.full((len(g.splits),), float("nan"), dtype=torch.float64)
            column[p.rows] = r.exp()
            own.append(column)
        out[REF_PROB] = torch.cat(own)
    # pi(a*|s_j) over the solutions CER counts (the first m when no sample has an answer)
    ref_probs = [
        r[p.counted.any(1) if p.distinct else slice(None, m)].exp()
        for (r, _, _, _), p in zip(scored, pairs, strict=True)
    ]
    stats = {
        "cer/ref_prob_mean": torch.stack([p.mean() for p in ref_probs]).mean().item(),
        "cer/ref_prob_max": torch.stack([p.max() for p in ref_probs]).mean().item(),
        "cer/distinct_answers": sum(len(d) for *_, d in scored) / len(scored),
    }
    return {k: v for k, v in out.items() if k in types}, stats, scores


def common_groups(groups: Sequence[Group]) -> list[parts.Group]:
    """CER's groups as ``common.rewards.Group``s: the problem, the reference (its other
    ``answer_forms`` as aliases), each sample's boxed answer; the CER group as ``source``."""
    return [
        parts.Group(
            g.example.problem,
            [g.example.answer],
            list(g.example.metadata.get("answer_forms", [])[1:]),
            g.trajs,
            [s.answer for s in g.splits],
            g,
        )
        for g in groups
    ]


@dataclass(frozen=True)
class CERScoring:
    """CER's part of a step's reward context (``ctx.scoring``): the scorer of pi(a*|s)
    (``score_fn``; needed by cer, rule+cer, verifree), ``m``, ``selection``, the verifier
    ``rules``, and ``types``: other reward types computed in the same pass (the scorer called
    once). Without it a reward gets the defaults and no scorer."""

    score_fn: ScoreFn | None = None
    m: int | None = None
    selection: str = "first"
    rules: Rules = DEFAULT_RULES
    types: tuple[str, ...] = ()


@dataclass(frozen=True)
class GroupReward:
    """Reward type ``type`` of ``group_rewards`` as an outcome reward over ``common_groups``,
    with the run's ``CERScoring`` (``ctx.scoring``). Metrics: the CER summary; extras:
    ``by_type``, every type computed (exact and rule always), and ``scores``, each group's
    ``GroupScores`` (None without a scored type): what the trainer's ``samples/`` reuse."""

    type: str

    def __call__(self, groups: Sequence[parts.Group], ctx: parts.RewardContext) -> parts.Rewards:
        x = parts.context_part(ctx, "scoring", CERScoring, f"reward {self.type}", CERScoring())
        by_type, stats, scores = scored_group_rewards(
            {self.type, *x.types},
            [g.source for g in groups],
            x.score_fn,
            ctx.tokenizer,
            x.m,
            x.selection,
            x.rules,
        )
        return parts.Rewards(by_type[self.type], stats, {"by_type": by_type, "scores": scores})


EXACT = GroupReward("exact")
RULE = GroupReward("rule")
CER = GroupReward("cer")
RULE_CER = GroupReward("rule+cer")
VERIFREE = GroupReward("verifree")
