from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cer.rewards.expectation import cer_from_logprobs, combine_rule_cer, verifree_reward

NEG_INF = float("-inf")


def direct_cer(ref_logp, answer_logp, answer_of_sample, m=None):
    """R_k = sum_j p(a_k|s_j) p(a*|s_j) / sum_j p(a_k|s_j), in probability space, loop by loop."""
    rows = range(len(ref_logp) if m is None else m)
    out = []
    for u in answer_of_sample:
        if u < 0:
            out.append(0.0)
            continue
        num = sum(math.exp(answer_logp[j][u]) * math.exp(ref_logp[j]) for j in rows)
        den = sum(math.exp(answer_logp[j][u]) for j in rows)
        out.append(num / den if den > 0 else 0.0)
    return out


# log probabilities in [-30, 0], or -inf (an answer the model cannot write after that solution)
_LOGP = st.one_of(st.floats(-30.0, 0.0), st.just(NEG_INF))


@st.composite
def groups(draw):
    j, u, g = draw(st.integers(1, 6)), draw(st.integers(0, 4)), draw(st.integers(1, 8))
    ref = draw(st.lists(_LOGP, min_size=j, max_size=j))
    ans = draw(st.lists(st.lists(_LOGP, min_size=u, max_size=u), min_size=j, max_size=j))
    of_sample = draw(st.lists(st.integers(-1, u - 1), min_size=g, max_size=g))
    m = draw(st.one_of(st.none(), st.integers(1, j)))
    return ref, ans, of_sample, m


def _tensors(ref, ans, of_sample):
    u = len(ans[0])
    return (
        torch.tensor(ref, dtype=torch.float64),
        torch.tensor(ans, dtype=torch.float64).reshape(len(ref), u),
        torch.tensor(of_sample, dtype=torch.long),
    )


@settings(max_examples=150)
@given(groups())
def test_matches_the_direct_ratio(group):
    ref, ans, of_sample, m = group
    rewards = cer_from_logprobs(*_tensors(ref, ans, of_sample), m=m)
    assert not torch.isnan(rewards).any()
    assert ((rewards >= 0) & (rewards <= 1)).all()
    assert rewards.tolist() == pytest.approx(direct_cer(ref, ans, of_sample, m), abs=1e-9)


@settings(max_examples=100)
@given(groups(), st.floats(-2000.0, 0.0))
def test_invariant_to_a_common_shift_of_an_answers_logprobs(group, shift):
    """The ratio is homogeneous in p(a_k|.): scaling by exp(shift) changes nothing, even where
    the probabilities themselves underflow (shift = -2000)."""
    ref, ans, of_sample, m = group
    r, a, k = _tensors(ref, ans, of_sample)
    assert torch.allclose(cer_from_logprobs(r, a + shift, k, m), cer_from_logprobs(r, a, k, m))


@settings(max_examples=100)
@given(st.lists(st.floats(-10.0, 0.0), min_size=1, max_size=16))
def test_reference_answer_beats_the_mean_reference_probability(ref):
    """a_k = a*: R_k = sum p^2 / sum p >= mean p."""
    r = torch.tensor(ref, dtype=torch.float64)
    reward = cer_from_logprobs(r, r[:, None], torch.tensor([0]))
    assert reward.item() >= r.exp().mean().item() - 1e-12


@settings(max_examples=100)
@given(st.integers(1, 8), st.integers(1, 5), st.integers(0, 2**31))
def test_expected_cer_equals_expected_exact_match(n_solutions, n_answers, seed):
    """Over the empirical policy of the group (s_j uniform, a ~ p(a|s_j), answers exhaustive,
    a* = answer 0): sum_a p(a) R(a) = mean_j p(a*|s_j) = P(a = a*)."""
    gen = torch.Generator().manual_seed(seed)
    logp = torch.log_softmax(3 * torch.randn(n_solutions, n_answers, generator=gen), -1)
    rewards = cer_from_logprobs(logp[:, 0], logp, torch.arange(n_answers, dtype=torch.long))
    p_answer = logp.exp().mean(0)  # [U]
    assert (p_answer * rewards).sum().item() == pytest.approx(p_answer[0].item(), abs=1e-6)


def test_hand_computed():
    # p(a*|s) = [0.5, 0.1], p(a_0|s) = [0.2, 0.4]: R = (0.1 + 0.04) / 0.6
    ref = torch.tensor([0.5, 0.1]).log()
    ans = torch.tensor([[0.2], [0.4]]).log()
    rewards = cer_from_logprobs(ref, ans, torch.tensor([0, -1, 0]))
    assert rewards.tolist() == pytest.approx([0.14 / 0.6, 0.0, 0.14 / 0.6], rel=1e-6)
    assert rewards.dtype == torch.float32
    # m = 1: only s_1 counts, R = p(a*|s_1)
    assert cer_from_logprobs(ref, ans, torch.tensor([0]), m=1).item() == pytest.approx(0.5)


def test_zero_probability_answers_and_references():
    ref = torch.tensor([NEG_INF, -1.0])
    ans = torch.tensor([[NEG_INF, -2.0], [NEG_INF, NEG_INF]])
    rewards = cer_from_logprobs(ref, ans, torch.tensor([0, 1]))
    # answer 0 is impossible after every solution; answer 1 is only possible after s_0, where
    # the reference is impossible
    assert rewards.tolist() == [0.0, 0.0]


def test_no_answers_at_all():
    rewards = cer_from_logprobs(torch.zeros(3), torch.zeros(3, 0), torch.tensor([-1, -1, -1]))
    assert rewards.tolist() == [0.0, 0.0, 0.0]


def test_rewards_are_detached():
    ref = torch.tensor([-0.5, -1.0], requires_grad=True)
    ans = torch.tensor([[-0.3], [-2.0]], requires_grad=True)
    assert not cer_from_logprobs(ref, ans, torch.tensor([0, 0])).requires_grad
    assert not verifree_reward(ref).requires_grad
    assert not combine_rule_cer(torch.tensor([True, False]), ref.exp()).requires_grad


@pytest.mark.parametrize(
    ("ref", "ans", "of_sample", "m", "message"),
    [
        (torch.zeros(2), torch.zeros(3, 1), torch.tensor([0]), None, "must be \\[J\\]"),
        (torch.zeros(2), torch.zeros(2, 1), torch.tensor([1]), None, "entries in \\[-1, 1\\)"),
        (torch.zeros(2), torch.zeros(2, 1), torch.tensor([-2]), None, "entries in"),
        (torch.tensor([0.0, math.nan]), torch.zeros(2, 1), torch.tensor([0]), None, "NaN"),
        (torch.zeros(2), torch.zeros(2, 1), torch.tensor([0]), 0, "m must be"),
    ],
)
def test_bad_inputs(ref, ans, of_sample, m, message):
    with pytest.raises(ValueError, match=message):
        cer_from_logprobs(ref, ans, of_sample, m=m)


def test_verifree_and_rule_plus_cer():
    ref_own = torch.tensor([0.0, math.log(0.25), NEG_INF])
    assert verifree_reward(ref_own).tolist() == pytest.approx([1.0, 0.25, 0.0])
    cer = torch.tensor([0.3, 0.6, 0.0])
    combined = combine_rule_cer(torch.tensor([1, 0, 0]), cer)
    assert combined.tolist() == pytest.approx([1.0, 0.6, 0.0])
