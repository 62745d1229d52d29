"""EviBack's reward gate, backoff terms and λ-scaled group advantages, by hand."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from common.retrieval.base import Doc
from common.rollout.trajectory import Step, Trajectory
from eviback.reward import (
    RolloutFacts,
    group_rewards,
    is_eligible,
    is_supported,
    rollout_facts,
    scaled_group_advantages,
    teacher_f1,
)
from eviback.teacher import Verdict

S = Verdict(True, "S", "Ora Velk", "r")
A = Verdict(True, "A", "", "r")
I = Verdict(True, "I", "", "r")  # noqa: E741
BAD = Verdict(False, None, error="parse: x")
GOOD = RolloutFacts(has_evidence=True, well_formed=True, answered=True)


def test_actor_first_gate_gives_each_rollout_its_em():
    rewards, fell_back = group_rewards(
        em=[0, 1, 0, 1],
        supported=[True, True, True, False],
        eligible=[True, False, False, False],
        f1=[1.0, 1.0, 0.5, 0.0],
        has_evidence=[True] * 4,
    )
    assert rewards == [0.0, 1.0, 0.0, 1.0] and fell_back is False


def test_all_zero_group_backoff_rewards():
    rewards, fell_back = group_rewards(
        em=[0, 0, 0, 0, 0],
        supported=[True, True, False, True, False],
        eligible=[True, False, False, True, False],
        f1=[0.5, 0.8, 0.9, 1.0, 0.0],
        has_evidence=[True, True, True, False, False],
    )
    # 0.1 + 0.1*0.5; supported only; nothing; no evidence -> 0 despite support; nothing
    assert rewards == pytest.approx([0.15, 0.1, 0.0, 0.0, 0.0]) and fell_back is True


def test_beta_and_gamma():
    rewards, _ = group_rewards(
        [0, 0], [True, True], [True, False], [0.5, 0.5], [True, True], 0.2, 0.4
    )
    assert rewards == pytest.approx([0.2 + 0.4 * 0.5, 0.2])


def test_all_zero_group_with_nothing_falls_back_to_zeros():
    rewards, fell_back = group_rewards(
        [0, 0], [False, False], [False, False], [0, 0], [False, False]
    )
    assert rewards == [0.0, 0.0] and fell_back is True


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"em": [0.5, 0]}, "EM must be 0 or 1"),
        ({"f1": [1.5, 0]}, "F1 must lie"),
        ({"eligible": [True, False], "supported": [False, False]}, "eligible but not supported"),
        ({"has_evidence": [True]}, "has_evidence has 1"),
        ({"f1": [0.0]}, "f1 has 1"),
    ],
)
def test_bad_group_inputs_are_errors(kwargs, match):
    args = {
        "em": [0, 0],
        "supported": [True, False],
        "eligible": [False, False],
        "f1": [0.0, 0.0],
        "has_evidence": [True, True],
        **kwargs,
    }
    with pytest.raises(ValueError, match=match):
        group_rewards(**args)


@given(
    st.lists(
        st.tuples(
            st.sampled_from([0, 1]),
            st.booleans(),
            st.booleans(),
            st.floats(0, 1),
            st.booleans(),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_reward_bounds(rows):
    em, sup, eli, f1, ev = (list(x) for x in zip(*rows, strict=True))
    eli = [e and s for e, s in zip(eli, sup, strict=True)]
    rewards, fell_back = group_rewards(em, sup, eli, f1, ev)
    assert fell_back == (sum(em) == 0)
    if fell_back:
        assert all(0.0 <= r <= 0.2 + 1e-12 for r in rewards)
        assert all(r == 0.0 for r, e in zip(rewards, ev, strict=True) if not e)
    else:
        assert rewards == [float(e) for e in em]


def test_supported_means_valid_s_or_a():
    assert is_supported(S) and is_supported(A)
    assert not is_supported(I) and not is_supported(BAD) and not is_supported(None)


def test_eligible_conditions_one_at_a_time():
    assert is_eligible(S, GOOD)
    assert not is_eligible(A, GOOD)  # supported, but ambiguous verdicts carry no answer
    assert not is_eligible(I, GOOD)
    assert not is_eligible(S, RolloutFacts(True, well_formed=False, answered=True))
    assert not is_eligible(S, RolloutFacts(True, well_formed=True, answered=False))
    assert not is_eligible(Verdict(True, "S", "   ", "r"), GOOD)  # blank teacher answer
    assert not is_eligible(None, GOOD)


def test_teacher_f1_against_gold():
    assert teacher_f1(S, ["Ora Velk"]) == 1.0
    assert teacher_f1(Verdict(True, "S", "Velk", ""), ["Ora Velk", "Zuro"]) == pytest.approx(2 / 3)
    assert teacher_f1(BAD, ["Ora Velk"]) == 0.0 and teacher_f1(None, ["x"]) == 0.0


def _traj(steps, answer="Tamsford", num_invalid=0, forced_terminated=False):
    t = Trajectory("g", 0, "q", "Q?", ["Tamsford"], [1])
    t.steps, t.answer, t.num_invalid, t.forced_terminated = (
        steps,
        answer,
        num_invalid,
        forced_terminated,
    )
    return t


def test_rollout_facts_from_a_trajectory():
    doc = Doc("d", "T", "text", 1.0)
    searched = [Step("search", 0, 2, query="q", docs=[doc]), Step("answer", 2, 4)]
    assert rollout_facts(_traj(searched)) == RolloutFacts(True, True, True)
    empty_search = [Step("search", 0, 2, query="q", docs=[]), Step("answer", 2, 4)]
    assert not rollout_facts(_traj(empty_search)).has_evidence
    assert not rollout_facts(_traj([Step("answer", 0, 2)])).has_evidence
    assert not rollout_facts(_traj(searched, num_invalid=1)).well_formed
    assert not rollout_facts(_traj(searched, answer=None, forced_terminated=True)).answered
    assert not rollout_facts(_traj(searched, answer="  ")).answered


# --- advantages ------------------------------------------------------------------------------


def test_advantages_by_hand():
    rewards = [1.0, 0.0, 0.0, 1.0, 0.1, 0.2, 0.0, 0.3]
    groups = ["a", "a", "a", "a", "b", "b", "b", "c"]
    scales = [1.0, 1.0, 1.0, 1.0, 0.1, 0.1, 0.1, 0.1]
    adv = scaled_group_advantages(rewards, groups, scales)
    # group a: mean 0.5, std_ddof1 = sqrt(4 * 0.25 / 3) = sqrt(1/3)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    # group b: mean 0.1, deviations (0, 0.1, -0.1), std_ddof1 = sqrt(0.02 / 2) = 0.1; then λ
    b = 0.1 * 0.1 / (0.1 + 1e-6)
    # group c has one member: keeps its reward, times its scale
    expected = [a, -a, -a, a, 0.0, b, -b, 0.03]
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)


def test_lambda_scales_after_normalisation():
    rewards = torch.tensor([0.0, 0.1, 0.2, 0.1])
    plain = scaled_group_advantages(rewards, [7] * 4, [1.0] * 4)
    scaled = scaled_group_advantages(rewards, [7] * 4, [0.1] * 4)
    assert torch.allclose(scaled, 0.1 * plain)
    # the same λ on the reward instead would be normalised away
    assert torch.allclose(
        scaled_group_advantages(0.1 * rewards, [7] * 4, [1.0] * 4), plain, atol=1e-3
    )


def test_equal_rewards_give_zero_advantage():
    assert scaled_group_advantages([0.1, 0.1, 0.1], [0, 0, 0], [0.1] * 3).tolist() == [0.0] * 3


def test_scale_must_be_constant_within_a_group():
    with pytest.raises(ValueError, match="group 'q2' has more than one advantage scale"):
        scaled_group_advantages([0, 1, 0, 1], ["q1", "q1", "q2", "q2"], [1, 1, 1, 0.1])


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="same length"):
        scaled_group_advantages([0.0, 1.0], ["a", "a"], [1.0])
