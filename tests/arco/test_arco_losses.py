from __future__ import annotations

import math

import pytest
import torch

from arco.losses import (
    class_weights,
    decomposition_loss,
    masked_token_mean,
    policy_step_loss,
    rubric_sft_loss,
    token_kl,
)


def test_class_weights_one_positive_of_four():
    w = class_weights(torch.tensor([1.0, 0.0, 0.0, 0.0]))
    # n = 4, n_pos = 1, n_neg = 3: 4 / (2 * 1) = 2 and 4 / (2 * 3) = 2/3; each class sums to 2
    torch.testing.assert_close(w, torch.tensor([2.0, 2 / 3, 2 / 3, 2 / 3]))
    assert w.sum().item() == pytest.approx(4.0)


def test_class_weights_threshold_and_one_class():
    # R = 0.5 is not above 0.5: negative
    torch.testing.assert_close(class_weights(torch.tensor([0.5, 0.6])), torch.tensor([1.0, 1.0]))
    # no positive: 2 / (2 * 2) = 0.5 each (the max(n_pos, 1) never divides by 0)
    torch.testing.assert_close(class_weights(torch.tensor([0.0, 0.0])), torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(class_weights(torch.tensor([1.0, 1.0])), torch.tensor([0.5, 0.5]))
    assert class_weights(torch.tensor([1, 0])).dtype == torch.float32
    assert class_weights(torch.tensor([1.0, 0.0], dtype=torch.float64)).dtype == torch.float64


def test_decomposition_loss_by_hand():
    scores = torch.tensor([[0.2, 0.3, float("nan")], [0.5, -0.5, 0.4]])  # padding may hold junk
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    outcomes = torch.tensor([1.0, 0.0])
    weights = torch.tensor([2.0, 2 / 3])
    # tau1: 2 * (0.5 - 1)^2 = 0.5; tau2: 2/3 * (0.4 - 0)^2 = 0.10667
    got = decomposition_loss(scores, mask, outcomes, weights)
    torch.testing.assert_close(got, torch.tensor([0.5, 2 / 3 * 0.16]))


def test_decomposition_loss_gradient():
    scores = torch.tensor([[0.2, 0.3, 0.7]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    decomposition_loss(scores, mask, torch.tensor([1.0]), torch.tensor([2.0])).sum().backward()
    # d/ds_t of 2 (s_1 + s_2 - 1)^2 = 4 (0.5 - 1) = -2 on real steps, 0 on padding
    torch.testing.assert_close(scores.grad, torch.tensor([[-2.0, -2.0, 0.0]]))


def test_token_kl_two_token_vocabulary_by_hand():
    logits = torch.tensor([[[0.0, 0.0]]])  # p = [1/2, 1/2]
    ref = torch.tensor([[[math.log(3.0), 0.0]]])  # q = [3/4, 1/4]
    forward = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)  # = 0.5 ln(4/3) = 0.14384
    reverse = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)  # = 0.13081
    got_f = token_kl(logits, ref)
    got_r = token_kl(logits, ref, direction="reverse")
    assert got_f.shape == (1, 1)
    assert got_f.item() == pytest.approx(forward, abs=1e-6)
    assert got_r.item() == pytest.approx(reverse, abs=1e-6)
    # forward is the default and the two directions differ on this asymmetric pair
    assert abs(got_f.item() - got_r.item()) > 0.01
    torch.testing.assert_close(token_kl(logits, ref, "forward"), got_f)
    # swapping the arguments swaps the directions
    torch.testing.assert_close(token_kl(ref, logits, "reverse"), got_f)


def test_token_kl_nonnegative_and_zero_iff_equal():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=g)
    ref = torch.randn(3, 5, 7, generator=g)
    for direction in ("forward", "reverse"):
        kl = token_kl(logits, ref, direction)
        assert kl.shape == (3, 5)
        assert (kl > 1e-4).all()
        assert (token_kl(logits, logits, direction) == 0).all()
        # logits shifted by a constant are the same distribution
        assert token_kl(logits, logits + 3.0, direction).abs().max() < 1e-5


def test_token_kl_float32_from_bfloat16():
    logits = torch.randn(2, 3, 4).to(torch.bfloat16)
    assert token_kl(logits, torch.zeros(2, 3, 4, dtype=torch.bfloat16)).dtype == torch.float32


def test_token_kl_rejects_an_unknown_direction():
    x = torch.zeros(1, 1, 2)
    with pytest.raises(ValueError, match="'sideways'"):
        token_kl(x, x, direction="sideways")


def test_masked_token_mean_by_hand():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, float("nan")]])
    mask = torch.tensor([[1, 0, 1], [0, 0, 0], [0, 1, 0]])
    # row 0: (1 + 3) / 2; row 1: no token -> 0; row 2: 8 (the masked-out NaN does not leak)
    torch.testing.assert_close(masked_token_mean(values, mask), torch.tensor([2.0, 0.0, 8.0]))


def test_policy_step_loss_by_hand():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -0.2, -0.3]])
    adv = torch.tensor([[2.0, 2.0, -1.0], [-1.0, 0.5, 0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    # row 0: -(2 * -1 + 2 * -2) = 6; row 1: -(-1 * -0.1 + 0.5 * -0.2 + 0.5 * -0.3) = 0.15
    torch.testing.assert_close(policy_step_loss(logp, adv, mask), torch.tensor([6.0, 0.15]))


def test_policy_step_loss_gradient_only_through_logp():
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    adv = torch.tensor([[2.0, 2.0, -1.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0]])
    policy_step_loss(logp, adv, mask).sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-2.0, -2.0, 0.0]]))
    assert adv.grad is None


def test_rubric_sft_loss_by_hand():
    token_logp = torch.tensor([[-1.0, -2.0, -9.0], [-3.0, -9.0, -9.0]])
    token_mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    pred = torch.tensor([[0.5, 0.0], [0.0, 0.0]])
    target = torch.tensor([[0.0, 0.0], [0.0, 1.0]])
    # CE: a mean over the batch's 3 tokens (1 + 2 + 3) / 3 = 2, not the mean of row means (2.25)
    # MSE: (0.25 + 1) / 4 = 0.3125
    got = rubric_sft_loss(token_logp, token_mask, pred, target)
    assert got.dim() == 0
    assert got.item() == pytest.approx(2.0 + 10.0 * 0.3125)
    assert rubric_sft_loss(token_logp, token_mask, pred, target, 1.0).item() == pytest.approx(
        2.3125
    )
