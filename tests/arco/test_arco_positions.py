"""Log-probs and the exact token KL at the positions that count only: equal to the
whole-vocabulary, every-position computation (log-softmax over [N, T, V], masked afterwards)
in value and gradient, with the float32 vocabulary-sized tensors one [chunk, V] chunk at a time,
and the language-model head applied at those positions alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from arco.losses import masked_token_kl, masked_token_mean, scatter_positions, token_kl
from arco.rubric_model import build_arco_model
from arco.trainer import MuLoss, MuMicroBatch, policy_loss, rubric_loss
from common.rl import logprobs_from_logits
from common.rollout.batch import collate
from common.rollout.trajectory import Step, Trajectory

LORA = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


def old_token_kl(logits: torch.Tensor, ref: torch.Tensor, direction: str) -> torch.Tensor:
    """The unchunked computation: log-softmax of both over every position, [N, T]."""
    logp = F.log_softmax(logits.float(), dim=-1)
    logq = F.log_softmax(ref.float(), dim=-1)
    if direction == "reverse":
        logp, logq = logq, logp
    return (logp.exp() * (logp - logq)).sum(dim=-1)


def _random(n: int = 3, t: int = 9, v: int = 50) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(n, t, v, generator=g)).requires_grad_()
    ref = 3 * torch.randn(n, t, v, generator=g)
    mask = (torch.rand(n, t, generator=g) < 0.4).float()
    mask[2] = 0.0  # a row without any position that counts
    mask[0, 1] = 1.0
    return logits, ref, mask


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_masked_kl_equals_the_old_masked_mean_in_value_and_gradient(direction):
    logits, ref, mask = _random()
    weights = torch.tensor([0.7, -1.3, 2.0])
    old = masked_token_mean(old_token_kl(logits, ref, direction), mask)
    (g_old,) = torch.autograd.grad((weights * old).sum(), logits)
    new_tok = masked_token_kl(logits, ref, mask, direction, chunk_size=2)
    assert (new_tok[mask == 0] == 0).all()
    new = masked_token_mean(new_tok, mask)
    (g_new,) = torch.autograd.grad((weights * new).sum(), logits)
    torch.testing.assert_close(new, old, rtol=0, atol=1e-6)
    torch.testing.assert_close(g_new, g_old, rtol=0, atol=1e-6)
    assert new[2] == 0 and (g_new[mask == 0] == 0).all()


def test_kl_log_softmaxes_are_chunks_of_positions_that_count(monkeypatch):
    """Every float32 log-softmax (forward, and the checkpoint's recompute in the backward) is
    over at most ``chunk_size`` rows of the masked positions, never [N, T, V]."""
    logits, ref, mask = _random()
    shapes: list[tuple[int, ...]] = []
    real = F.log_softmax

    def spy(x, *args, **kwargs):
        shapes.append(tuple(x.shape))
        return real(x, *args, **kwargs)

    monkeypatch.setattr(F, "log_softmax", spy)
    n = int(mask.sum())
    masked_token_kl(logits, ref, mask, "forward", chunk_size=2).sum().backward()
    assert shapes and all(len(s) == 2 and s[0] <= 2 and s[1] == 50 for s in shapes)
    # forward: 2 log-softmaxes over all n rows; backward: the same again (recomputed)
    assert sum(s[0] for s in shapes) == 4 * n


def test_token_kl_on_gathered_rows_and_scatter_back():
    logits, ref, mask = _random()
    m = mask.bool()
    rows = token_kl(logits[m], ref[m], "reverse", chunk_size=3)  # [n]
    torch.testing.assert_close(rows, old_token_kl(logits, ref, "reverse")[m], rtol=0, atol=1e-6)
    back = scatter_positions(rows, m)
    assert back.shape == mask.shape and (back[~m] == 0).all()
    torch.testing.assert_close(back[m], rows)
    with pytest.raises(ValueError, match="chunk_size"):
        token_kl(logits, ref, chunk_size=0)


@pytest.fixture(scope="module")
def model(tiny_world):
    torch.manual_seed(0)
    m = build_arco_model(tiny_world / "model", LORA, k=3)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():  # adapters and head away from the references, so the KL is not 0
        for p in m.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    return m


def test_logits_at_positions_equal_the_whole_logits_there(model):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 200, (3, 8), generator=g)
    attn = torch.ones_like(ids)
    attn[1, -3:] = 0
    at = torch.rand(3, 8, generator=g) < 0.5
    for adapter in ("policy", "rubric_ref"):
        full, s_full = model(adapter, ids, attn, pool_mask=attn)
        some, s_some = model(adapter, ids, attn, pool_mask=attn, logit_mask=at)
        assert some.shape == (int(at.sum()), full.shape[-1])
        torch.testing.assert_close(some, full[at], rtol=0, atol=1e-5)
        torch.testing.assert_close(s_some, s_full, rtol=0, atol=1e-6)
    none, _ = model("policy", ids, attn, logit_mask=torch.zeros_like(at))
    assert none.shape == (0, full.shape[-1])


class _Train:
    """The parts of TrainEngine the losses use: the training forward and the model."""

    def __init__(self, model):
        self.model, self.device = model, torch.device("cpu")

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)


def _trajectory(n_steps: int, first: int) -> Trajectory:
    t = Trajectory(f"g{first}", 0, f"q{first}", "q?", ["a"], [5, 6, 7, first])
    for j in range(n_steps):
        start = len(t.response_ids)
        t.append([first + 3 * j, first + 3 * j + 1, 9], sampled=True, logprobs=[0.0] * 3)
        t.steps.append(Step("search" if j < n_steps - 1 else "answer", start, start + 3))
        if j < n_steps - 1:
            t.append([50 + j, 51, 52, 53], sampled=False)
    return t


def _trained_grads(model) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_policy_loss_equals_the_whole_logits_path(model, direction):
    trajs = [_trajectory(2, 30), _trajectory(3, 60), _trajectory(1, 90)]
    adv = [[0.5, -0.2], [1.0, 0.3, -0.7], [0.4]]
    model.zero_grad(set_to_none=True)
    loss, stats = policy_loss(_Train(model), trajs, adv, 0.05, direction, 0)
    loss.backward()
    got = _trained_grads(model)
    # the old path: the whole logits, log-probs and the KL at every position, masked afterwards
    b = collate(trajs, 0)
    logits, _ = model("policy", b.input_ids, b.attention_mask)
    with torch.no_grad():
        ref, _ = model("policy_ref", b.input_ids, b.attention_mask)
    logp = logprobs_from_logits(logits[:, :-1], b.input_ids[:, 1:])
    kl_tok = old_token_kl(logits[:, :-1], ref[:, :-1], direction)
    want = 0.0
    for i, t in enumerate(trajs):
        p = len(t.prompt_ids) - 1
        for s, a in zip(t.steps, adv[i], strict=True):
            span = slice(p + s.start, p + s.end)
            want = want - a * logp[i, span].sum() + 0.05 * kl_tok[i, span].mean()
    want.backward()
    old = _trained_grads(model)
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-6)
    assert stats["pi_kl"] > 0
    assert set(got) == set(old)
    for n in got:
        torch.testing.assert_close(got[n], old[n], rtol=1e-6, atol=1e-6)


def test_rubric_loss_kl_equals_the_whole_logits_path(model):
    from arco.rubrics import RubricItem, rubric_batch

    items = [
        RubricItem(0, 0, [5, 6, 7, 8], criteria_ids=[20, 21, 2]),
        RubricItem(0, 1, [5, 6, 7, 8, 9, 10], criteria_ids=[22, 2]),
        RubricItem(1, 0, [5, 6, 11], criteria_ids=[23, 24, 25, 2]),
    ]
    outcomes, weights = torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0])
    model.zero_grad(set_to_none=True)
    mb = MuMicroBatch(items, outcomes, weights)
    loss, stats = rubric_loss(_Train(model), mb, MuLoss(0.05, "forward", False, 0))
    loss.backward()
    got = _trained_grads(model)
    ids, attn, crit = rubric_batch(items, 0, torch.device("cpu"))
    logits, scores = model("rubric", ids, attn, pool_mask=attn)
    with torch.no_grad():
        ref, _ = model("rubric_ref", ids, attn)
    kl = masked_token_mean(old_token_kl(logits[:, :-1], ref[:, :-1], "forward"), crit)
    s = scores.mean(-1)
    want = (s[0] + s[1] - 1.0) ** 2 + (s[2] - 0.0) ** 2 + 0.05 * kl.sum()
    want.backward()
    old = _trained_grads(model)
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-6)
    assert stats["mu_kl"] > 0
    for n in got:
        torch.testing.assert_close(got[n], old[n], rtol=1e-6, atol=1e-6)
