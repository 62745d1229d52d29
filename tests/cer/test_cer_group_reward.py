from __future__ import annotations

import pytest
import torch

from cer.data import MathExample
from cer.prompt import INSTRUCTION, MC_INSTRUCTION, SYSTEM_PROMPT, user_message
from cer.rewards.answer import solution_split
from cer.rewards.expectation import cer_from_logprobs
from cer.rewards.groups import Group, Rules, group_rewards, score_groups, scored_group_rewards
from cer.rewards.scoring import hf_prefix_scorer, score_group
from cer.rewards.scoring_tokens import CountingScorer


def make_group(tok, problem: str, gold: str, responses: list[str], mc: bool = False) -> Group:
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    prompt = tok.encode(problem, add_special_tokens=False)
    ids = [tok.encode(r, add_special_tokens=False) + [eos] for r in responses]
    ex = MathExample(problem, problem, gold, {"multiple_choice": True} if mc else {})
    return Group(ex, prompt, [], [solution_split(i, tok) for i in ids])


@pytest.fixture(scope="module")
def groups(char_tokenizer):
    return [
        make_group(
            char_tokenizer,
            "Half of 1?",
            "\\frac{1}{2}",
            ["Half of 1 is \\boxed{0.5}", "hence \\boxed{1/2}", "so \\boxed{\\frac{1}{2}}", "7"],
        ),
        make_group(char_tokenizer, "5 + 7?", "12", ["5 + 7 = \\boxed{12}", "\\boxed{1}"]),
    ]


def test_verifier_rewards_by_hand(groups, char_tokenizer):
    rewards, stats = group_rewards(["exact", "rule"], groups, None, char_tokenizer)
    # 0.5 and 1/2 are right but not the reference's string; a missing box is wrong for both
    assert rewards["exact"].tolist() == [0, 0, 1, 0, 1, 0]
    assert rewards["rule"].tolist() == [1, 1, 1, 0, 1, 0]
    assert stats == {} and set(rewards) == {"exact", "rule"}


def test_scored_rewards_equal_per_group_scoring(groups, char_tokenizer, tiny_qwen3):
    calls = []
    scorer = hf_prefix_scorer(tiny_qwen3)

    def score_fn(prefixes, continuations, last_alternatives=None, generated=None):
        calls.append(len(prefixes))
        return scorer(prefixes, continuations, last_alternatives, generated)

    rewards, stats = group_rewards(
        ["cer", "rule+cer", "verifree"], groups, score_fn, char_tokenizer
    )
    assert len(calls) == 1  # all groups of the step in one request
    expected_cer, expected_ref = [], []
    for g in groups:
        ref, ans, idx, _ = score_group(
            scorer, g.prompt_ids, g.splits, g.example.answer, char_tokenizer
        )
        expected_cer.append(cer_from_logprobs(ref, ans, idx).float())
        expected_ref.append(ref)
    cer = torch.cat(expected_cer)
    assert torch.allclose(rewards["cer"], cer, atol=1e-6)
    assert rewards["cer"][3] == 0 and ((cer >= 0) & (cer <= 1)).all()
    rule = torch.tensor([1.0, 1, 1, 0, 1, 0])
    assert torch.allclose(rewards["rule+cer"], torch.where(rule > 0, 1.0, cer))
    assert torch.allclose(rewards["verifree"], torch.cat(expected_ref).exp().float(), atol=1e-6)
    probs = [r.exp() for r in expected_ref]
    assert stats["cer/ref_prob_mean"] == pytest.approx(sum(p.mean() for p in probs).item() / 2)
    assert stats["cer/ref_prob_max"] == pytest.approx(sum(p.max() for p in probs).item() / 2)
    assert stats["cer/distinct_answers"] == (3 + 2) / 2


def test_m_limits_the_solutions(groups, char_tokenizer, tiny_qwen3):
    scorer = hf_prefix_scorer(tiny_qwen3)
    got = score_groups(scorer, groups, char_tokenizer, m=1)
    assert [r.shape[0] for r, *_ in got] == [1, 1]
    rewards, _ = group_rewards(["cer"], groups, scorer, char_tokenizer, m=1)
    # with one solution s_1, R_k = pi(a*|s_1) for every answer reachable from it
    first = torch.cat(
        [r[0].exp().repeat(len(g.splits)) for (r, *_), g in zip(got, groups, strict=True)]
    )
    has_answer = torch.tensor([s.answer is not None for g in groups for s in g.splits])
    assert torch.allclose(rewards["cer"], torch.where(has_answer, first.float(), 0.0), atol=1e-6)


def test_scored_type_without_scorer_is_an_error(groups, char_tokenizer):
    with pytest.raises(ValueError, match="need a score_fn"):
        group_rewards(["cer"], groups, None, char_tokenizer)


def test_multiple_choice_uses_letter_match(char_tokenizer):
    # letters the char tokenizer knows: F and H
    g = make_group(
        char_tokenizer, "Pick", "H", ["\\boxed{H}", "\\boxed{H.}", "\\boxed{F}"], mc=True
    )
    rewards, _ = group_rewards(["rule"], [g], None, char_tokenizer)
    assert rewards["rule"].tolist() == [1, 1, 0]
    assert user_message(g.example).endswith(INSTRUCTION + " " + MC_INSTRUCTION)
    assert SYSTEM_PROMPT == "You are a helpful assistant."


def test_the_multiple_choice_prompt_is_the_release_s_letter_in_the_box(char_tokenizer):
    """The release (recipe/cer/src/data_preparation.py, qwen_multi_choice_prompt) appends "Please
    only provide the letter of the answer in the box." to the step-by-step line, on one line
    after the question; under ``choice_verifier: strict`` (the release's check) only the boxed
    letter itself scores, which is what that prompt asks for."""
    g = make_group(char_tokenizer, "Pick", "H", ["\\boxed{H}", "H", "\\boxed{H.}"], mc=True)
    assert user_message(g.example) == (
        "Pick\nPlease reason step by step, and put your final answer within \\boxed{}. "
        "Please only provide the letter of the answer in the box."
    )
    strict = Rules(choice="strict")
    rewards, _ = group_rewards(["rule"], [g], None, char_tokenizer, rules=strict)
    assert rewards["rule"].tolist() == [1, 0, 0]


def test_ref_prob_is_each_samples_own_scored_solution(groups, char_tokenizer, tiny_qwen3):
    scorer = hf_prefix_scorer(tiny_qwen3)
    rewards, _ = group_rewards(["cer", "ref_prob"], groups, scorer, char_tokenizer, m=1)
    own = rewards["ref_prob"]
    # m = 1: only each group's first solution is scored, the others are NaN
    assert torch.isnan(own).tolist() == [False, True, True, True, False, True]
    first = [score_group(scorer, g.prompt_ids, g.splits, g.example.answer, char_tokenizer, m=1)
             for g in groups]  # fmt: skip
    assert own[0].item() == pytest.approx(first[0][0][0].exp().item(), rel=1e-6)
    assert own[4].item() == pytest.approx(first[1][0][0].exp().item(), rel=1e-6)
    everyone, _ = group_rewards(["verifree", "ref_prob"], groups, scorer, char_tokenizer)
    # every solution scored: pi(a*|s_k) is VeriFree's reward where the sample has an answer
    assert not torch.isnan(everyone["ref_prob"]).any()
    has_answer = torch.tensor([1, 1, 1, 0, 1, 1], dtype=torch.bool)
    assert torch.allclose(
        everyone["ref_prob"][has_answer].float(), everyone["verifree"][has_answer], atol=1e-6
    )


@pytest.mark.parametrize("m", [None, 1])
def test_every_type_at_once_leaves_the_cer_values_and_stats(groups, char_tokenizer, tiny_qwen3, m):
    # reward.signal asks for all five types and ref_prob: every solution is then scored, but
    # CER still averages over the m it selects
    scorer = hf_prefix_scorer(tiny_qwen3)
    alone, alone_stats = group_rewards(["cer"], groups, scorer, char_tokenizer, m=m)
    every, every_stats = group_rewards(
        ["exact", "rule", "cer", "rule+cer", "verifree", "ref_prob"],
        groups, scorer, char_tokenizer, m=m,
    )  # fmt: skip
    assert torch.allclose(alone["cer"], every["cer"], atol=1e-7)
    assert alone_stats == pytest.approx(every_stats)


@pytest.mark.parametrize("m", [None, 1])
@pytest.mark.parametrize("reward_types", [["cer"], ["cer", "verifree", "ref_prob"]])
def test_samples_reuse_the_reward_s_scores_each_pair_scored_once(
    groups, char_tokenizer, tiny_qwen3, m, reward_types
):
    """The trainer's samples/ pass (every type on the first groups) reads the reward pass's
    scores: a pair is never scored twice in a step, and the values are the reward's own."""
    scorer = hf_prefix_scorer(tiny_qwen3)
    calls: list[list[tuple]] = []

    def score_fn(prefixes, continuations, last_alternatives=None, generated=None):
        calls.append([(tuple(p), tuple(c)) for p, c in zip(prefixes, continuations, strict=True)])
        return scorer(prefixes, continuations, last_alternatives, generated)

    every = ["exact", "rule", "cer", "rule+cer", "verifree"]
    counting = CountingScorer(score_fn)
    by_type, stats, scores = scored_group_rewards(
        reward_types, groups, counting, char_tokenizer, m=m
    )
    reward_tokens = counting.take()
    assert len(calls) == 1 and reward_tokens > 0 and len(scores) == len(groups)
    shown, shown_stats, _ = scored_group_rewards(
        every, groups[:1], counting, char_tokenizer, m=m, known=scores[:1]
    )
    covered = m is None or "verifree" in reward_types  # every solution already scored
    assert len(calls) == (1 if covered else 2)
    assert (counting.take() == 0) == covered
    pairs = [pair for call in calls for pair in call]
    assert len(pairs) == len(set(pairs))  # each (solution, answer) pair scored once
    n = len(groups[0].splits)
    for k in by_type.keys() & set(every):
        assert torch.equal(shown[k], by_type[k][:n]), k
    # the same as a pass of its own (the trainer's before), up to the scorer's batch round-off
    own, own_stats = group_rewards(every, groups[:1], scorer, char_tokenizer, m=m)
    for k in every:
        torch.testing.assert_close(shown[k], own[k], rtol=1e-5, atol=1e-7)
    assert shown_stats == pytest.approx(own_stats, rel=1e-5)
