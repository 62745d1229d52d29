from __future__ import annotations

import pytest
import torch

from arco.advantages import (
    bucket_baseline,
    dense_advantages,
    position_buckets,
    reward_to_go,
    sparse_group_advantages,
)

# The hand-worked batch of two trajectories:
#   tau1: search, search, answer    s = [0.2, -0.1, 0.5]  ->  G = [0.6, 0.4, 0.5]
#   tau2: search, invalid, answer   s = [0.3, -0.4, 0.9]  ->  G = [0.8, 0.5, 0.9]
# All six returns sum to 3.7: the batch mean, the baseline of any bucket of one, is 3.7 / 6.
STEP_REWARDS = [[0.2, -0.1, 0.5], [0.3, -0.4, 0.9]]
KINDS = [["search", "search", "answer"], ["search", "invalid", "answer"]]
RETURNS = [[0.6, 0.4, 0.5], [0.8, 0.5, 0.9]]
BATCH_MEAN = 3.7 / 6


def test_reward_to_go_by_hand():
    assert reward_to_go([1.0, 2.0, 3.0]) == [6.0, 5.0, 3.0]
    assert reward_to_go([0.2, -0.1, 0.5]) == pytest.approx([0.6, 0.4, 0.5])
    assert reward_to_go([-1.0]) == [-1.0]
    assert reward_to_go([]) == []


def test_position_buckets_with_answer():
    assert position_buckets(["search", "search", "answer"]) == ["search_1", "search_2", "terminal"]
    assert position_buckets(["answer"]) == ["terminal"]


def test_position_buckets_invalid_both_ways():
    kinds = ["search", "invalid", "search", "answer"]
    # searches are counted on their own: the search after the invalid step is the second one
    assert position_buckets(kinds) == ["search_1", "invalid", "search_2", "terminal"]
    assert position_buckets(kinds, invalid_bucket=False) == [
        "search_1",
        "terminal",
        "search_2",
        "terminal",
    ]


def test_position_buckets_without_answer_the_last_step_is_terminal():
    # a search on the forced-finish turn ends the episode
    four_searches = ["search", "search", "search", "search"]
    assert position_buckets(four_searches) == ["search_1", "search_2", "search_3", "terminal"]
    assert position_buckets(["search", "invalid"]) == ["search_1", "terminal"]
    assert position_buckets(["invalid", "invalid"]) == ["invalid", "terminal"]
    assert position_buckets(["invalid", "invalid"], invalid_bucket=False) == [
        "terminal",
        "terminal",
    ]
    assert position_buckets([]) == []


def test_position_buckets_rejects_an_unknown_kind():
    with pytest.raises(ValueError, match="'think'"):
        position_buckets(["search", "think"])


def test_bucket_baseline_by_hand():
    buckets = [["search_1", "search_2", "terminal"], ["search_1", "invalid", "terminal"]]
    # search_1 = {0.6, 0.8} -> 0.7; terminal = {0.5, 0.9} -> 0.7;
    # search_2 and invalid have one member each -> the batch mean
    expected = [[0.7, BATCH_MEAN, 0.7], [0.7, BATCH_MEAN, 0.7]]
    got = bucket_baseline(RETURNS, buckets)
    for g, e in zip(got, expected, strict=True):
        assert g == pytest.approx(e)


def test_bucket_baseline_shape_mismatch():
    with pytest.raises(ValueError, match="same shape"):
        bucket_baseline([[1.0, 2.0]], [["terminal"]])


def test_dense_advantages_with_invalid_bucket():
    got = dense_advantages(STEP_REWARDS, KINDS)
    # A = 0.5 (G - b) with b from test_bucket_baseline_by_hand
    expected = [
        [0.5 * (0.6 - 0.7), 0.5 * (0.4 - BATCH_MEAN), 0.5 * (0.5 - 0.7)],  # -0.05, -0.10833, -0.1
        [0.5 * (0.8 - 0.7), 0.5 * (0.5 - BATCH_MEAN), 0.5 * (0.9 - 0.7)],  # 0.05, -0.05833, 0.1
    ]
    for g, e in zip(got, expected, strict=True):
        assert g == pytest.approx(e)
    assert got[0][1] == pytest.approx(-0.108333, abs=1e-6)


def test_dense_advantages_invalid_in_terminal_like_the_release():
    got = dense_advantages(STEP_REWARDS, KINDS, invalid_bucket=False)
    # terminal = {0.5, 0.5 (tau2's invalid step), 0.9} -> 1.9 / 3; search_2 alone -> batch mean
    terminal = 1.9 / 3
    expected = [
        [0.5 * (0.6 - 0.7), 0.5 * (0.4 - BATCH_MEAN), 0.5 * (0.5 - terminal)],
        [0.5 * (0.8 - 0.7), 0.5 * (0.5 - terminal), 0.5 * (0.9 - terminal)],
    ]
    for g, e in zip(got, expected, strict=True):
        assert g == pytest.approx(e)
    assert got[1][2] == pytest.approx(0.133333, abs=1e-6)


def test_dense_advantages_scale_and_empty_trajectory():
    # one real step: its bucket has one member, so b = batch mean = its own G and A = 0
    assert dense_advantages([[], [0.2]], [[], ["answer"]]) == [[], [0.0]]
    # c scales linearly: c = 1 doubles the default
    half = dense_advantages(STEP_REWARDS, KINDS)
    full = dense_advantages(STEP_REWARDS, KINDS, c=1.0)
    for h, f in zip(half, full, strict=True):
        assert f == pytest.approx([2 * a for a in h])
    assert dense_advantages([], []) == []


def test_dense_advantages_length_mismatch():
    with pytest.raises(ValueError):
        dense_advantages([[0.1]], [])


def test_sparse_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    groups = ["q1", "q1", "q2", "q1", "q2", "q3"]
    # q1 = {1, 0, 1} -> mean 2/3; q2 = {1, 0} -> 0.5; q3 = {0} -> 0; no std division
    expected = torch.tensor([1 / 3, -2 / 3, 0.5, 1 / 3, -0.5, 0.0])
    got = sparse_group_advantages(rewards, groups)
    assert got.shape == (6,)
    assert got.dtype == rewards.dtype
    torch.testing.assert_close(got, expected)


def test_sparse_group_advantages_detached_and_checked():
    rewards = torch.tensor([2.0, 0.0], requires_grad=True)
    got = sparse_group_advantages(rewards, ["g", "g"])
    assert not got.requires_grad
    torch.testing.assert_close(got, torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError):
        sparse_group_advantages(torch.zeros(3), ["a", "b"])


def test_the_estimators_as_parts_equal_the_functions_and_load_by_path():
    from arco.advantages import DenseAdvantages, sparse_group
    from common.rewards import ESTIMATORS, Rewards, load_part, spread_to_tokens

    scores = [[0.2, 0.5], [0.1, 0.0, 0.4], [0.3]]
    kinds = [["search", "answer"], ["search", "invalid", "answer"], ["answer"]]
    spans = [[(0, 2), (5, 6)], [(0, 1), (4, 5), (7, 9)], [(0, 3)]]
    lengths = [6, 10, 3]
    layout = {"step_kinds": kinds, "step_tokens": spans, "response_tokens": lengths}
    r = Rewards(torch.tensor([1.0, 0.0, 1.0]), extras=layout)
    ids = ["a", "a", "b"]
    dense = load_part(
        "arco.advantages:DenseAdvantages", "reward.advantage", "estimator", ESTIMATORS
    )
    per_step = dense_advantages(scores, kinds, 0.5, True)
    assert dense(r, ids, scores) == spread_to_tokens(per_step, spans, lengths)
    got = DenseAdvantages(c=1.0, invalid_bucket=False)(r, ids, scores)
    assert got == spread_to_tokens(dense_advantages(scores, kinds, 1.0, False), spans, lengths)
    # by hand, trajectory 0: step 0's A on tokens 0-1, the answer's on token 5, 0 between
    a0 = per_step[0]
    assert got[0] != dense(r, ids, scores)[0]  # c and the bucket matter
    assert dense(r, ids, scores)[0] == [a0[0], a0[0], 0.0, 0.0, 0.0, a0[1]]
    assert [len(a) for a in dense(r, ids, scores)] == lengths
    assert torch.equal(sparse_group(r, ids), sparse_group_advantages(r.values, ids))
    assert sparse_group(r, ids).tolist() == [0.5, -0.5, 0.0]  # a: mean 1/2; b: alone
    with pytest.raises(ValueError, match="needs step_scores"):
        dense(r, ids)
    with pytest.raises(ValueError, match="step_layout"):
        dense(Rewards(r.values, extras={"step_kinds": kinds}), ids, scores)
    with pytest.raises(ValueError, match="2 score lists for 3 trajectories"):
        dense(r, ids, scores[:2])
