"""`loss.skip_zero_advantage`: a micro-batch's rows whose every advantage is 0 (an all-zero
GRPO group's) stay out of the update's forward, and the step is the one of the whole batch."""

from __future__ import annotations

import math

import pytest
import torch

from common.rl import aggregate_loss
from common.rl_loop import LossConfig, policy_update, stand_in, trained_rows
from common.rollout.trajectory import Trajectory
from common.train import TrainConfig, TrainEngine
from tests.test_shared_prompt import groups, tiny

AGGREGATIONS = [
    "seq_mean_token_mean",
    "token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
]


def test_aggregate_loss_over_a_subset_keeps_the_batchs_denominators():
    # rows a, b of a batch of three (b, c had loss 0): a = [1, 2] (mask 1, 1), b = [4, _] (1, 0)
    loss = torch.tensor([[1.0, 2.0], [4.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    sub = dict(num_seqs=3, num_tokens=5.0)  # the third row had 2 masked tokens
    assert aggregate_loss(loss, mask, "seq_mean_token_mean", **sub).item() == pytest.approx(
        (1.5 + 4.0) / 3
    )
    assert aggregate_loss(loss, mask, "token_mean", **sub).item() == pytest.approx(7.0 / 5)
    assert aggregate_loss(loss, mask, "seq_mean_token_sum", **sub).item() == pytest.approx(7 / 3)
    got = aggregate_loss(loss, mask, "seq_mean_token_sum_norm", constant=4, **sub).item()
    assert got == pytest.approx(7.0 / 12)
    # without them, the rows' own: the earlier behaviour
    assert aggregate_loss(loss, mask, "token_mean").item() == pytest.approx(7.0 / 3)
    assert aggregate_loss(loss, mask, "seq_mean_token_mean").item() == pytest.approx(5.5 / 2)
    with pytest.raises(ValueError, match="less than the 2 rows"):
        aggregate_loss(loss, mask, "token_mean", num_seqs=1)


def test_trained_rows_are_the_nonzero_ones():
    trajs = groups([6, 4])  # 6 rows; row 2 has no response
    on, off = LossConfig(), LossConfig(skip_zero_advantage=False)
    adv = torch.tensor([0.0, 1.0, 0.0, 0.0, -0.5, 0.0])
    assert trained_rows(trajs, adv, on) == [1, 4]
    assert trained_rows(trajs, adv, off) == list(range(6))
    assert trained_rows(trajs, adv, LossConfig(kl_coef=0.1)) == list(range(6))  # the KL's gradient
    assert trained_rows(trajs, torch.zeros(6), on) == []
    # token advantages: a row counts if any token's is nonzero
    tokens = [[0.0] * len(t.response_ids) for t in trajs]
    tokens[5][-1] = 0.25
    assert trained_rows(trajs, tokens, on) == [5]


def update(
    trajs: list[Trajectory], advantages, mbs: int, skip: bool, aggregation: str
) -> tuple[dict, dict]:
    engine = TrainEngine(tiny("llama", seed=3), TrainConfig(lr=1e-2, grad_accum=len(trajs) // mbs))
    cfg = LossConfig(
        micro_batch_size=mbs, logprob_chunk=5, skip_zero_advantage=skip, aggregation=aggregation
    )
    stats = policy_update(engine, trajs, advantages, cfg, pad_id=0)
    return stats, {k: p.detach().clone() for k, p in engine.model.named_parameters()}


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("per_token", [False, True])
def test_leaving_zero_advantage_rows_out_takes_the_whole_batchs_step(aggregation, per_token):
    trajs = groups([6, 4, 5, 3])  # 4 groups of 3; micro-batches of 6: two groups each
    gen = torch.Generator().manual_seed(7)
    adv = torch.randn(len(trajs), generator=gen)
    adv[3:] = 0  # groups 1-3 all-zero: the second micro-batch has no signal at all
    advantages = adv
    if per_token:  # ARCO's dense shape: one per response token, a row's values not all alike
        advantages = [[float(a) * (1 + j) for j in range(len(t.response_ids))] for t, a in
                      zip(trajs, adv, strict=True)]  # fmt: skip
    skipped, skipped_weights = update(trajs, advantages, 6, True, aggregation)
    whole, whole_weights = update(trajs, advantages, 6, False, aggregation)
    assert whole["update_rows"] == 12
    # group 0's rows (its empty one has no token advantage to be nonzero); the second
    # micro-batch forwards two tokens of its first row (``stand_in``), no row to train
    kept = trajs[:3] if not per_token else [trajs[0], trajs[1]]
    assert skipped["update_rows"] == len(kept)
    forwarded = sum(len(t.prompt_ids) + len(t.response_ids) for t in kept) + 2
    assert skipped["tokens/update_forwarded"] == forwarded
    assert skipped["tokens/update"] == whole["tokens/update"]  # the batch's, as the cost model's
    assert skipped["tokens/update_forwarded"] < whole["tokens/update_forwarded"] / 2
    assert whole["loss"] != 0
    assert skipped["loss"] == pytest.approx(whole["loss"], abs=1e-6)
    assert skipped["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-5)
    for name, w in whole_weights.items():  # Adam's first step: ±lr where the gradient is not ~0
        torch.testing.assert_close(skipped_weights[name], w, atol=1e-5, rtol=0, msg=name)
    moved = sum(int((w - tiny("llama", seed=3).state_dict()[n]).abs().max() > 1e-3)
                for n, w in whole_weights.items())  # fmt: skip
    assert moved > 0


def test_an_all_zero_batch_still_runs_a_forward_per_micro_batch_and_moves_nothing():
    trajs = groups([6, 4])
    stats, weights = update(trajs, torch.zeros(6), 3, True, "seq_mean_token_mean")
    assert stats["update_rows"] == 0 and stats["loss"] == 0 and stats["grad_norm"] == 0
    assert stats["tokens/update_forwarded"] == 2 * 2  # two tokens in each of two micro-batches
    assert math.isnan(stats["logprob_gap"])  # no sampled token forwarded: nothing measured
    start = tiny("llama", seed=3).state_dict()
    for name, w in weights.items():
        torch.testing.assert_close(w, start[name], atol=0, rtol=0, msg=name)


def test_the_stand_in_is_two_tokens_of_the_first_row_with_nothing_to_learn():
    trajs = groups([6, 4])
    t = stand_in(trajs[3:])
    assert t.prompt_ids == trajs[3].prompt_ids[:2] and t.response_ids == [] and t.loss_mask == []
    one = groups([1, 4])  # a one-token prompt: its response's first token completes the two
    assert stand_in(one).prompt_ids == one[0].prompt_ids + one[0].response_ids[:1]
