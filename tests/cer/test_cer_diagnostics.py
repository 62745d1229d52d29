"""cer.rewards.diagnostics: the within-group AUC and the per-step signal metrics, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from cer.rewards.diagnostics import signal_metrics, within_group_auc
from common.rl import rloo_advantages

IDS = ["a", "a", "a", "b", "b", "b", "b", "c", "c"]
RIGHT = torch.tensor([1, 0, 0, 1, 0, 1, 0, 0, 0], dtype=torch.bool)


def test_within_group_auc_by_hand():
    scores = torch.tensor([0.9, 0.2, 0.5, 0.3, 0.3, 0.1, 0.4, 0.7, 0.1])
    concordant, pairs = within_group_auc(scores, RIGHT, IDS)
    # group a: 0.9 above 0.2 and 0.5 (2 of 2); group b: right {0.3, 0.1} against wrong
    # {0.3, 0.4}: one tie (0.5), nothing above (0 of 4); group c: no right sample, no pair
    assert pairs == 2 + 4
    assert concordant == pytest.approx(2.5)


def test_pairs_across_groups_do_not_count():
    # the right sample of group x is below the wrong one of group y: no pair between them
    assert within_group_auc(torch.tensor([0.1, 0.9]), torch.tensor([True, False]), ["x", "y"]) == (
        0.0,
        0,
    )


def test_within_group_auc_checks_shapes():
    with pytest.raises(ValueError, match="must all be"):
        within_group_auc(torch.zeros(3), torch.zeros(2, dtype=torch.bool), ["a"] * 3)


def test_signal_metrics_by_hand():
    cer = torch.tensor([0.9, 0.2, 0.5, 0.3, 0.3, 0.1, 0.4, 0.7, 0.1])
    rule = RIGHT.float()
    ref_prob = torch.tensor([0.8, 0.1, float("nan"), 0.4, 0.2, 0.6, float("nan"), 0.3, 0.1])

    def rloo(r, ids):
        return rloo_advantages(r, ids)

    out = signal_metrics({"cer": cer, "rule": rule}, RIGHT, ref_prob, IDS, rloo)
    assert out["signal/ref_prob_right"] == pytest.approx((0.8 + 0.4 + 0.6) / 3)
    assert out["signal/ref_prob_wrong"] == pytest.approx((0.1 + 0.2 + 0.3 + 0.1) / 4)
    assert out["signal/ref_prob_right_n"] == 3 and out["signal/ref_prob_wrong_n"] == 4
    assert out["signal/mixed_pairs"] == 6
    assert out["signal/auc/cer"] == pytest.approx(2.5 / 6)
    assert "signal/auc/rule" not in out  # the oracle's own verdict: 1 by construction
    # RLOO: A_k = r_k - mean of the others. rule, group a [1, 0, 0]: 1, -0.5, -0.5; b [1, 0, 1,
    # 0]: 2/3, -2/3, 2/3, -2/3; c [0, 0]: 0, 0
    want = (1 + 0.5 + 0.5 + 4 * 2 / 3) / 9
    assert out["signal/abs_adv/rule"] == pytest.approx(want)
    by_hand = rloo(cer.double(), IDS).abs().mean().item()
    assert out["signal/abs_adv/cer"] == pytest.approx(by_hand)


def test_signal_metrics_without_scores_or_pairs():
    verdict = torch.tensor([False, False])
    out = signal_metrics(
        {"exact": torch.zeros(2)}, verdict, None, ["g", "g"], lambda r, ids: r - r.mean()
    )
    assert out == {"signal/mixed_pairs": 0.0, "signal/abs_adv/exact": 0.0}
    nan = torch.tensor([math.nan, math.nan], dtype=torch.float64)
    out = signal_metrics({}, verdict, nan, ["g", "g"], lambda r, ids: r)
    assert out["signal/ref_prob_wrong_n"] == 0 and "signal/ref_prob_wrong" not in out
