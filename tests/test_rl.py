"""Tests of common/rl.py: hand-computed values, properties, and agreement with the naive
full-logits computation on a tiny random Qwen3."""

import math

import peft
import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

from common.rl import (
    aggregate_loss,
    broadcast_to_tokens,
    clipped_surrogate,
    entropy_from_logits,
    forward_logprobs,
    group_normalized_advantages,
    kl_k1,
    kl_k3,
    logprobs_from_hidden,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    rloo_advantages,
    sequence_logprobs,
)

MODES = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
fast = settings(max_examples=40)


def tiny_qwen3(seed: int = 0) -> transformers.Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = transformers.Qwen3Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        tie_word_embeddings=True,
    )
    return transformers.Qwen3ForCausalLM(config).float()


@pytest.fixture(scope="module")
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, 97, (3, 11), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :4] = 0  # left padding
    attention_mask[2, 8:] = 0  # right padding
    return input_ids, attention_mask


def naive_logprobs(model, input_ids, attention_mask):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), -1)
    entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1), entropy


def grads_of(model, loss) -> dict[str, torch.Tensor]:
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    return dict(zip(params, torch.autograd.grad(loss, list(params.values())), strict=True))


def assert_same_values_and_grads(model, input_ids, attention_mask):
    weights = torch.randn(input_ids.shape[0], input_ids.shape[1] - 1)
    logp, entropy = sequence_logprobs(
        model, input_ids, attention_mask, chunk_size=7, with_entropy=True
    )
    ref_logp, ref_entropy = naive_logprobs(model, input_ids, attention_mask)
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=0)
    got = grads_of(model, (weights * logp).sum() + entropy.sum())
    want = grads_of(model, (weights * ref_logp).sum() + ref_entropy.sum())
    assert got.keys() == want.keys()
    for name in got:
        torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=1e-4, msg=name)
    return logp


# --- log-probabilities and entropy ------------------------------------------------------


def test_sequence_logprobs_equal_naive_with_tied_embeddings(batch):
    model = tiny_qwen3()
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    logp = assert_same_values_and_grads(model, *batch)
    assert logp.shape == (3, 10)


def test_sequence_logprobs_equal_naive_with_an_lm_head_bias(batch):
    model = tiny_qwen3()
    model.lm_head = torch.nn.Linear(32, 97, bias=True)  # untied, with a bias Qwen3 lacks
    torch.nn.init.normal_(model.lm_head.bias)
    assert_same_values_and_grads(model, *batch)


def test_sequence_logprobs_equal_naive_for_peft_lora(batch):
    base = tiny_qwen3()
    base_logp, _ = naive_logprobs(base, *batch)
    # Random (not zero) LoRA B so the adapter changes the output and must be seen.
    lora = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = peft.get_peft_model(base, lora)
    logp = assert_same_values_and_grads(model, *batch)
    assert (logp - base_logp).abs().max() > 1e-3


def test_logprobs_from_hidden_applies_temperature():
    hidden, weight = torch.randn(2, 5, 8), torch.randn(13, 8)
    labels = torch.randint(0, 13, (2, 5))
    logp, entropy = logprobs_from_hidden(hidden, weight, labels, chunk_size=3, temperature=0.7)
    want = torch.log_softmax(hidden @ weight.T / 0.7, -1)
    torch.testing.assert_close(logp, want.gather(-1, labels[..., None]).squeeze(-1))
    assert entropy is None


def test_chunked_logprobs_never_keep_full_logits_for_backward():
    hidden = torch.randn(64, 8, requires_grad=True)
    weight = torch.randn(1000, 8, requires_grad=True)
    labels = torch.randint(0, 1000, (64,))
    largest_input = max(hidden.numel(), weight.numel())

    def largest_saved(fn) -> int:
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, id):
            fn()
        return max(sizes)

    assert largest_saved(lambda: torch.log_softmax(hidden @ weight.T, -1)) > largest_input
    assert largest_saved(lambda: logprobs_from_hidden(hidden, weight, labels, 16)) <= largest_input


def test_logprobs_and_entropy_by_hand():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # probabilities 1/4, 3/4
    logp = logprobs_from_logits(logits, torch.tensor([1]))
    torch.testing.assert_close(logp, torch.tensor([math.log(0.75)]))
    entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor([entropy]))


@fast
@given(
    batch_size=st.integers(1, 3),
    length=st.integers(1, 6),
    vocab=st.integers(2, 9),
    chunk_size=st.integers(1, 8),
    seed=st.integers(0, 1000),
)
def test_chunked_logits_functions_equal_naive(batch_size, length, vocab, chunk_size, seed):
    generator = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(batch_size, length, vocab, generator=generator)).requires_grad_()
    labels = torch.randint(0, vocab, (batch_size, length), generator=generator)
    full = torch.log_softmax(logits, -1)
    want = full.gather(-1, labels[..., None]).squeeze(-1) - (full.exp() * full).sum(-1)
    got = logprobs_from_logits(logits, labels, chunk_size) + entropy_from_logits(logits, chunk_size)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    (got_grad,) = torch.autograd.grad(got.sum(), logits)
    (want_grad,) = torch.autograd.grad(want.sum(), logits)
    torch.testing.assert_close(got_grad, want_grad, atol=1e-5, rtol=0)


def test_logprobs_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="do not match labels"):
        logprobs_from_logits(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


# --- clipped surrogate ------------------------------------------------------------------


def surrogate_at(ratio: float, advantage: float, **kwargs):
    logp = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    old_logp = torch.zeros(1, 1, dtype=torch.float64)
    advantages = torch.tensor([[advantage]], dtype=torch.float64)
    loss, stats = clipped_surrogate(logp, old_logp, advantages, torch.ones(1, 1), **kwargs)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    return loss.item(), grad.item(), stats


@pytest.mark.parametrize(
    ("ratio", "advantage", "kwargs", "loss", "grad", "clipped"),
    [
        (1.5, 1.0, {"eps_high": 0.28}, -1.28, 0.0, "clip_frac_high"),  # clipped: no gradient
        (1.2, 1.0, {"eps_high": 0.28}, -1.2, -1.2, None),  # inside the range: d(−rA)/dlogp = −rA
        (1.5, -1.0, {"eps_high": 0.28}, 1.5, 1.5, None),  # A < 0 never clips above
        (0.5, -1.0, {"eps_low": 0.2}, 0.8, 0.0, "clip_frac_low"),  # clipped below
        (0.5, 1.0, {"eps_low": 0.2}, -0.5, -0.5, None),  # A > 0 never clips below
        (5.0, -1.0, {"dual_clip": 3.0}, 3.0, 0.0, "dual_clip_frac"),  # capped at c·|A|
        (2.0, -1.0, {"dual_clip": 3.0}, 2.0, 2.0, None),  # under the cap
        (2.0, 1.0, {"dual_clip": 3.0}, -1.2, 0.0, "clip_frac_high"),  # A > 0: no dual clip
    ],
)
def test_clipped_surrogate_by_hand(ratio, advantage, kwargs, loss, grad, clipped):
    got_loss, got_grad, stats = surrogate_at(ratio, advantage, **kwargs)
    assert got_loss == pytest.approx(loss)
    assert got_grad == pytest.approx(grad)
    assert stats["ratio_mean"].item() == pytest.approx(ratio)
    for name in ("clip_frac_high", "clip_frac_low", "dual_clip_frac"):
        if name in stats:
            assert stats[name].item() == (1.0 if name == clipped else 0.0), name


def test_clip_stats_count_masked_tokens_only():
    logp = torch.log(torch.tensor([[1.5, 1.0, 1.5], [0.5, 9.0, 1.0]]))
    advantages = torch.tensor([[1.0, 1.0, 1.0], [-1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    _, stats = clipped_surrogate(logp, torch.zeros(2, 3), advantages, mask)
    assert stats["clip_frac"].item() == pytest.approx(2 / 4)
    assert stats["clip_frac_high"].item() == pytest.approx(1 / 4)
    assert stats["clip_frac_low"].item() == pytest.approx(1 / 4)
    assert stats["ratio_max"].item() == pytest.approx(1.5)
    assert stats["ratio_min"].item() == pytest.approx(0.5)
    assert stats["ratio_mean"].item() == pytest.approx((1.5 + 1 + 0.5 + 1) / 4)


def test_clipped_surrogate_rejects_bad_input():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="broadcast_to_tokens"):
        clipped_surrogate(x, x, torch.zeros(2), x)
    with pytest.raises(ValueError, match="dual_clip"):
        clipped_surrogate(x, x, x, x, dual_clip=0.5)


def token_tensors(seed: int, shape=(3, 5)):
    generator = torch.Generator().manual_seed(seed)
    logp = -torch.rand(shape, generator=generator, dtype=torch.float64) * 3
    old_logp = logp + 0.5 * torch.randn(shape, generator=generator, dtype=torch.float64)
    advantages = torch.randn(shape, generator=generator, dtype=torch.float64)
    mask = torch.rand(shape, generator=generator) < 0.6
    return logp, old_logp, advantages, mask


def loss_and_grad(logp, old_logp, advantages, mask, mode="token_mean", **kwargs):
    logp = logp.clone().requires_grad_()
    per_token, _ = clipped_surrogate(logp, old_logp, advantages, mask, **kwargs)
    constant = 7.0 if mode == "seq_mean_token_sum_norm" else None
    loss = aggregate_loss(per_token, mask, mode, constant)
    (grad,) = torch.autograd.grad(loss, logp)
    return per_token.detach(), loss.detach(), grad


@fast
@given(seed=st.integers(0, 10_000), mode=st.sampled_from(MODES), dual=st.sampled_from([None, 3.0]))
def test_zero_advantage_gives_zero_loss_and_gradient(seed, mode, dual):
    logp, old_logp, advantages, mask = token_tensors(seed)
    _, loss, grad = loss_and_grad(logp, old_logp, 0 * advantages, mask, mode, dual_clip=dual)
    assert loss.item() == 0.0
    assert torch.count_nonzero(grad) == 0


@fast
@given(seed=st.integers(0, 10_000), eps_low=st.floats(0.0, 0.5), eps_high=st.floats(0.0, 0.5))
def test_ratio_one_is_the_plain_policy_gradient(seed, eps_low, eps_high):
    logp, _, advantages, mask = token_tensors(seed)
    clip = {"eps_low": eps_low, "eps_high": eps_high}
    per_token, _, grad = loss_and_grad(
        logp, logp.clone(), advantages, mask, "seq_mean_token_sum", **clip
    )
    batch_size = logp.shape[0]
    torch.testing.assert_close(per_token, -advantages * mask)
    torch.testing.assert_close(grad, -advantages * mask / batch_size)


@fast
@given(seed=st.integers(0, 10_000), mode=st.sampled_from(MODES), dual=st.sampled_from([None, 3.0]))
def test_masked_positions_never_affect_the_loss(seed, mode, dual):
    logp, old_logp, advantages, mask = token_tensors(seed)
    junk = (500.0, -500.0, 5.0)  # exp(1000) overflows float64 if the ratio sees padding
    moved = [
        torch.where(mask, t, j) for t, j in zip((logp, old_logp, advantages), junk, strict=True)
    ]
    per_token, loss, grad = loss_and_grad(logp, old_logp, advantages, mask, mode, dual_clip=dual)
    per_token2, loss2, grad2 = loss_and_grad(*moved, mask, mode, dual_clip=dual)
    assert torch.equal(per_token, per_token2) and torch.equal(loss, loss2)
    assert torch.equal(grad, grad2)
    assert torch.count_nonzero(grad[~mask]) == 0 and torch.count_nonzero(per_token[~mask]) == 0


# --- aggregation ------------------------------------------------------------------------

PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "constant", "want"),
    [
        ("seq_mean_token_mean", None, ((1 + 2) / 2 + 4 / 1) / 2),
        ("token_mean", None, (1 + 2 + 4) / 3),
        ("seq_mean_token_sum", None, ((1 + 2) + 4) / 2),
        ("seq_mean_token_sum_norm", 3.0, (1 + 2 + 4) / (2 * 3)),
    ],
)
def test_aggregate_loss_by_hand(mode, constant, want):
    assert aggregate_loss(PER_TOKEN, MASK, mode, constant).item() == pytest.approx(want)


def test_aggregate_loss_counts_empty_sequences():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert aggregate_loss(PER_TOKEN, mask, "seq_mean_token_mean").item() == pytest.approx(0.75)


def test_aggregate_loss_rejects_bad_modes_and_constants():
    with pytest.raises(ValueError, match="unknown loss aggregation 'sum'"):
        aggregate_loss(PER_TOKEN, MASK, "sum")
    with pytest.raises(ValueError, match="constant is required"):
        aggregate_loss(PER_TOKEN, MASK, "seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="constant is required"):
        aggregate_loss(PER_TOKEN, MASK, "token_mean", 4.0)
    with pytest.raises(ValueError, match="must be > 0"):
        aggregate_loss(PER_TOKEN, MASK, "seq_mean_token_sum_norm", 0.0)


def test_masked_helpers_by_hand():
    assert masked_sum(PER_TOKEN, MASK).item() == 7.0
    torch.testing.assert_close(masked_mean(PER_TOKEN, MASK, dim=1), torch.tensor([1.5, 4.0]))
    assert masked_mean(PER_TOKEN, torch.zeros_like(MASK)).item() == 0.0


# --- KL ---------------------------------------------------------------------------------


def test_kl_estimators_by_hand():
    logp, ref_logp = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    assert kl_k1(logp, ref_logp).item() == pytest.approx(math.log(2))
    assert kl_k3(logp, ref_logp).item() == pytest.approx(0.5 - math.log(0.5) - 1)  # δ = ln ½
    assert kl_k1(logp, ref_logp, torch.tensor([[0]])).item() == 0.0
    assert kl_k3(logp, torch.tensor([[100.0]]), torch.tensor([[0]])).item() == 0.0


@fast
@given(vocab=st.integers(2, 8), seed=st.integers(0, 10_000))
def test_kl_estimators_are_unbiased_and_k3_nonnegative(vocab, seed):
    generator = torch.Generator().manual_seed(seed)
    logp = torch.log_softmax(torch.randn(vocab, generator=generator, dtype=torch.float64), -1)
    ref_logp = torch.log_softmax(torch.randn(vocab, generator=generator, dtype=torch.float64), -1)
    kl = (logp.exp() * (logp - ref_logp)).sum()
    # Exact expectation over y ~ π instead of a sample mean.
    torch.testing.assert_close((logp.exp() * kl_k1(logp, ref_logp)).sum(), kl)
    torch.testing.assert_close((logp.exp() * kl_k3(logp, ref_logp)).sum(), kl)
    assert (kl_k3(logp, ref_logp) >= 0).all()


# --- advantages -------------------------------------------------------------------------


def test_group_normalized_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    std = math.sqrt(1 / 3)  # Σ(r − ½)² / (4 − 1)
    want = torch.tensor([1, -1, -1, 1], dtype=torch.float64) * 0.5 / (std + 1e-6)
    torch.testing.assert_close(group_normalized_advantages(rewards, [7, 7, 7, 7]), want)
    population = group_normalized_advantages(rewards, [7] * 4, ddof=0)
    sign = torch.tensor([1, -1, -1, 1], dtype=torch.float64)
    torch.testing.assert_close(population, sign * 0.5 / (0.5 + 1e-6))  # population std ½
    centred = group_normalized_advantages(rewards, [7] * 4, scale_by_std=False)
    torch.testing.assert_close(centred, torch.tensor([0.5, -0.5, -0.5, 0.5], dtype=torch.float64))


def test_group_normalized_advantages_with_string_groups_and_singletons():
    rewards = torch.tensor([1.0, 2.0, 3.0, 5.0, 9.0, 4.0, 4.0])
    groups = ["a", "b", "a", "b", "solo", "same", "same"]
    got = group_normalized_advantages(rewards, groups, eps=0.0)
    s = 1 / math.sqrt(2)  # a: ∓1/√2 (std √2); b: ∓1.5/√4.5; solo and equal rewards: 0
    torch.testing.assert_close(got, torch.tensor([-s, -s, s, s, 0.0, 0.0, 0.0]))
    by_int = group_normalized_advantages(rewards, torch.tensor([0, 1, 0, 1, 2, 3, 3]), eps=0.0)
    torch.testing.assert_close(by_int, got)


def test_advantages_reject_bad_input():
    with pytest.raises(ValueError, match="3 group ids for 4 rewards"):
        group_normalized_advantages(torch.zeros(4), [0, 0, 1])
    with pytest.raises(ValueError, match="1-D"):
        rloo_advantages(torch.zeros(2, 2), [0, 0, 1, 1])
    with pytest.raises(ValueError, match="ddof"):
        group_normalized_advantages(torch.zeros(2), [0, 0], ddof=-1)


def test_rloo_advantages_by_hand():
    got = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 5.0]), ["q", "q", "q", "q", "x"])
    torch.testing.assert_close(got, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0]))
    assert rloo_advantages(torch.tensor([1, 0]), [0, 0]).tolist() == [1.0, -1.0]


grouped_rewards = st.lists(
    st.tuples(st.integers(0, 4), st.floats(-10, 10, allow_nan=False)), min_size=1, max_size=20
)


@fast
@given(samples=grouped_rewards)
def test_advantages_sum_to_zero_within_each_group(samples):
    groups = [g for g, _ in samples]
    rewards = torch.tensor([r for _, r in samples], dtype=torch.float64)
    normalized = group_normalized_advantages(rewards, groups)
    loo = rloo_advantages(rewards, groups)
    for g in set(groups):
        members = torch.tensor([x == g for x in groups])
        count = int(members.sum())
        assert abs(normalized[members].sum().item()) < 1e-6 * max(1.0, count)
        assert abs(loo[members].sum().item()) < 1e-9 * 20
        # RLOO is the centred reward scaled by n / (n − 1).
        centred = rewards[members] - rewards[members].mean()
        want = centred * count / (count - 1) if count > 1 else torch.zeros(1, dtype=torch.float64)
        torch.testing.assert_close(loo[members], want)


def test_broadcast_to_tokens():
    got = broadcast_to_tokens(torch.tensor([2.0, -1.0]), torch.tensor([[0, 1, 1], [1, 1, 0]]))
    torch.testing.assert_close(got, torch.tensor([[0.0, 2.0, 2.0], [-1.0, -1.0, 0.0]]))
    with pytest.raises(ValueError, match="must be \\[B\\]"):
        broadcast_to_tokens(torch.zeros(3), torch.zeros(2, 4))


def test_forward_logprobs_equals_naive_and_chunked():
    model = tiny_qwen3()
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    naive = torch.log_softmax(model(input_ids=ids).logits[:, :-1], -1)
    naive = naive.gather(-1, ids[:, 1:, None]).squeeze(-1)
    got = forward_logprobs(model, ids, mask, chunk_size=5)
    chunked, _ = sequence_logprobs(model, ids, mask)
    torch.testing.assert_close(got, naive, atol=1e-5, rtol=0)
    torch.testing.assert_close(got, chunked, atol=1e-5, rtol=0)


def test_group_shares_counts_all_zero_and_mixed_groups():
    from common.rl_loop import group_shares

    # groups of 3: all zero, mixed, all one, mixed (partial credit counts as a reward)
    rewards = torch.tensor([0, 0, 0, 0, 1, 0, 1, 1, 1, 0.5, 0, 0])
    assert group_shares(rewards, 3) == {"all_zero_share": 0.25, "mixed_group_share": 0.5}
    assert group_shares(torch.zeros(4), 2) == {"all_zero_share": 1.0, "mixed_group_share": 0.0}
    with pytest.raises(RuntimeError):  # not whole groups
        group_shares(torch.zeros(5), 2)
