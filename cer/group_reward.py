"""Every reward type for sampled groups: verifier checks, and CER's scoring batched over groups.

A ``Group`` is one prompt, its G sampled responses and their answer splits. ``group_rewards``
returns the rewards of the requested types over all samples (group after group) and, when a
scored type is among them, the CER matrix summary.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cer.answer import AnswerSplit
from cer.data import MathExample
from cer.reward import cer_from_logprobs, combine_rule_cer, verifree_reward
from cer.scorer import ScoreFn, group_pairs
from cer.verifiers import alias_verifier, exact_verifier, letter_verifier, rule_verifier
from common.rollout.engine import GeneratedKV
from common.rollout.trajectory import Trajectory

SCORED_TYPES = ("cer", "rule+cer", "verifree")


@dataclass
class Group:
    """One prompt and its G samples (``trajs[k]`` and ``splits[k]`` are sample k)."""

    example: MathExample
    prompt_ids: list[int]
    trajs: list[Trajectory]
    splits: list[AnswerSplit]
    # each sample's generation cache when the engine kept it (HFEngine(keep_kv=True)), else None
    kvs: list[GeneratedKV | None] | None = None


def verifier_name(example: MathExample) -> str:
    """Which verifier is the rule for ``example``: ``alias`` (its row says ``verifier: alias``:
    the alias oracle over its ``answer_forms``), ``letter`` (multiple choice) or ``math-verify``."""
    if example.metadata.get("verifier") == "alias":
        return "alias"
    return "letter" if example.metadata.get("multiple_choice") else "math-verify"


def is_correct(answer: str | None, example: MathExample) -> bool:
    """The rule verifier (``verifier_name``): the alias oracle for alias rows, letter match for
    multiple choice, math-verify otherwise."""
    if answer is None:
        return False
    name = verifier_name(example)
    if name == "alias":
        return alias_verifier(answer, example.metadata["answer_forms"])
    if name == "letter":
        return letter_verifier(answer, example.answer)
    return rule_verifier(answer, example.answer)


def is_exact(answer: str | None, example: MathExample) -> bool:
    """Normalised string match with the reference."""
    return answer is not None and exact_verifier(answer, example.answer)


def score_groups(
    score_fn: ScoreFn, groups: Sequence[Group], tokenizer: Any, m: int | None
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[str]]]:
    """``score_group`` for every group with a single ``score_fn`` call carrying all pairs (the
    prefix scorer shares each prompt and solution across them; one request for an engine)."""
    pairs = [
        group_pairs(g.prompt_ids, g.splits, g.example.answer, tokenizer, m, g.kvs) for g in groups
    ]
    flat = score_fn(
        [x for p in pairs for x in p.prefixes],
        [x for p in pairs for x in p.continuations],
        [x for p in pairs for x in p.alternatives],
        [x for p in pairs for x in p.generated],
    )
    out, pos = [], 0
    for p in pairs:
        out.append(p.matrices(flat[pos : pos + len(p.prefixes)]))
        pos += len(p.prefixes)
    return out


def group_rewards(
    types: Iterable[str],
    groups: Sequence[Group],
    score_fn: ScoreFn | None,
    tokenizer: Any,
    m: int | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Rewards [N] (N = all samples, group by group) for each of ``types`` (``exact`` and
    ``rule`` always come along: they are cheap and are the accuracy), and the CER summary:
    ``cer/ref_prob_mean`` (mean over groups of mean_j pi(a*|s_j)), ``cer/ref_prob_max`` (mean
    over groups of max_j), ``cer/distinct_answers`` (per group, mean)."""
    types = set(types) | {"exact", "rule"}
    samples = [(s.answer, g.example) for g in groups for s in g.splits]
    out = {
        "exact": torch.tensor([float(is_exact(a, ex)) for a, ex in samples]),
        "rule": torch.tensor([float(is_correct(a, ex)) for a, ex in samples]),
    }
    stats: dict[str, float] = {}
    if not types & set(SCORED_TYPES):
        return out, stats
    if score_fn is None:
        raise ValueError(f"reward types {sorted(types & set(SCORED_TYPES))} need a score_fn")
    # VeriFree needs pi(a* | s_k) after every sample's own solution: score all G then.
    scored = score_groups(score_fn, groups, tokenizer, None if "verifree" in types else m)
    cer = torch.cat([cer_from_logprobs(r, a, idx, m).float() for r, a, idx, _ in scored])
    out["cer"] = cer
    out["rule+cer"] = combine_rule_cer(out["rule"], cer)
    if "verifree" in types:
        out["verifree"] = torch.cat([verifree_reward(r).float() for r, _, _, _ in scored])
    ref_probs = [r[:m].exp() for r, _, _, _ in scored]
    stats = {
        "cer/ref_prob_mean": torch.stack([p.mean() for p in ref_probs]).mean().item(),
        "cer/ref_prob_max": torch.stack([p.max() for p in ref_probs]).mean().item(),
        "cer/distinct_answers": sum(len(d) for *_, d in scored) / len(scored),
    }
    return {k: v for k, v in out.items() if k in types}, stats
