"""μ's scoring forward and its update's forward are one(``rl.mu_single_forward``):
with LoRA dropout 0 the step scores, the advantages, the losses and the optimizer step's
gradients equal the two-forward path's, and μ forwards its rows once a batch instead of twice."""

from __future__ import annotations

import pytest
import torch
from test_arco_ablations import EPISODES, cfg_for

from arco.advantages import dense_advantages
from arco.rubric_model import build_arco_model
from arco.rubric_prompt import format_criteria
from arco.rubrics import score_items, step_rewards
from arco.trainer import (
    make_rubric_items,
    mu_single_forward,
    rubric_update,
    update,
    update_batch,
)
from arco.warmup import trajectory_from_episode
from common.rollout.agent import encode_text
from common.train import TrainEngine


@pytest.fixture(scope="module")
def tokenizer(tiny_world):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_world / "model")


def _one_update(tiny_world, tokenizer, single: bool, *extra: str) -> dict:
    """One dense update on the two hand-built episodes (micro-batches of one trajectory): the
    scores, advantages, statistics, the gradients the optimizer step saw and μ's forwards."""
    cfg = cfg_for(tiny_world, "rl.micro_batch_size=1", *extra)
    torch.manual_seed(0)
    model = build_arco_model(tiny_world / "model", cfg.lora.as_peft(), cfg.rubric.head_k)
    with torch.no_grad():  # every weight off its start: KL > 0, every LoRA matrix a gradient
        g = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    cfg.train.grad_accum = 2 * (2 if single else 1)  # two micro-batches of trajectories
    train = TrainEngine(
        model, cfg.train, param_groups=model.groups({"policy": 1e-2, "rubric": 1e-2, "head": 1e-2})
    )
    trajs = [trajectory_from_episode(ep, tokenizer, cfg.agent) for ep in EPISODES]
    items = make_rubric_items(cfg, EPISODES, tokenizer)
    for it in items:  # criteria as μ would have written them
        it.criteria_ids = encode_text(tokenizer, format_criteria(["a", "b", "c"])) + [
            tokenizer.eos_token_id
        ]
    rewards = torch.tensor([1.0, 0.0])
    calls: list[str] = []
    model.register_forward_pre_hook(lambda m, args: calls.append(args[0]))
    seen: dict[str, torch.Tensor] = {}
    backend_step = train._backend.step

    def record(boundary: bool, skip: bool = False):
        if boundary:
            seen.update(
                {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            )
        return backend_step(boundary, skip)

    train._backend.step = record
    mu_stats: dict[str, float] = {}
    if single:
        mu_stats = rubric_update(train, items, rewards, cfg, tokenizer.pad_token_id, {})
    else:
        score_items(model, items, tokenizer.pad_token_id, 8)
    kinds = [[s.kind for s in ep.steps] for ep in EPISODES]
    adv = dense_advantages(step_rewards(items, 2), kinds, cfg.rl.c, cfg.rl.invalid_bucket)
    batch = update_batch(trajs, items, adv, rewards, True, mu_done=single)
    stats = update(train, batch, cfg, tokenizer.pad_token_id)
    assert train.global_step == 1
    return {
        "scores": [it.scores for it in items],
        "adv": adv,
        "stats": {**mu_stats, **stats},
        "grads": seen,
        "calls": calls,
    }


@pytest.mark.parametrize("kl", ["0.05", "0.0"])
def test_one_forward_equals_two_forwards(tiny_world, tokenizer, kl):
    old = _one_update(tiny_world, tokenizer, False, f"rl.mu_kl_coef={kl}")
    new = _one_update(tiny_world, tokenizer, True, f"rl.mu_kl_coef={kl}")
    torch.testing.assert_close(
        torch.tensor(new["scores"]), torch.tensor(old["scores"]), rtol=0, atol=1e-6
    )
    for a, b in zip(new["adv"], old["adv"], strict=True):
        assert a == pytest.approx(b, abs=1e-6)
    assert set(new["stats"]) == set(old["stats"])
    for k, v in old["stats"].items():
        assert new["stats"][k] == pytest.approx(v, rel=1e-6, abs=1e-6), k
    assert set(new["grads"]) == set(old["grads"]) and any(".rubric." in n for n in new["grads"])
    for n, g in old["grads"].items():
        torch.testing.assert_close(new["grads"][n], g, rtol=1e-6, atol=1e-6)
    # 5 rubric rows (2 + 3 steps) in micro-batches of one trajectory: the old path scores them
    # in one no-grad forward (score_batch_size 8), then forwards them again per micro-batch
    n_ref = 2 if kl != "0.0" else 0  # μ_ref only for the KL
    assert old["calls"].count("rubric") == 1 + 2 and new["calls"].count("rubric") == 2
    assert old["calls"].count("rubric_ref") == new["calls"].count("rubric_ref") == n_ref
    assert new["calls"].count("policy") == old["calls"].count("policy") == 2


def test_single_forward_only_where_mu_trains(tiny_world):
    assert mu_single_forward(cfg_for(tiny_world))
    assert not mu_single_forward(cfg_for(tiny_world, "rl.mu_single_forward=false"))
    assert not mu_single_forward(cfg_for(tiny_world, "rl.freeze_rubric=true"))
    assert not mu_single_forward(cfg_for(tiny_world, "method=outcome_only"))
