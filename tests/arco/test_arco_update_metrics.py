"""ARCO's update logs what TRL and verl users look for, on two hand-built episodes:
``entropy`` (π's, over the sampled tokens, from the update's own logits), ``lr`` (π's group) and
``lr/<group>``, ``clip_frac`` (0: ARCO's π loss has no ratio to clip) and the response lengths."""

from __future__ import annotations

import pytest
import torch
from test_arco_ablations import EPISODES, cfg_for

from arco.rubric_model import build_arco_model
from arco.trainer import make_rubric_items, update, update_batch
from arco.warmup import trajectory_from_episode
from common.rollout.batch import collate
from common.train import TrainEngine


@pytest.fixture(scope="module")
def tokenizer(tiny_world):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_world / "model")


def test_arco_update_logs_entropy_lr_clip_fraction_and_response_lengths(tiny_world, tokenizer):
    cfg = cfg_for(tiny_world, "rl.micro_batch_size=1", "rl.freeze_rubric=true")
    torch.manual_seed(0)
    model = build_arco_model(tiny_world / "model", cfg.lora.as_peft(), cfg.rubric.head_k)
    cfg.train.grad_accum = 2  # two micro-batches of one trajectory, one optimizer step
    lrs = {"policy": 2e-3, "rubric": 1e-3, "head": 5e-3}
    train = TrainEngine(model, cfg.train, param_groups=model.groups(lrs))
    trajs = [trajectory_from_episode(ep, tokenizer, cfg.agent) for ep in EPISODES]
    items = make_rubric_items(cfg, EPISODES, tokenizer)
    # π's entropy over every sampled token, by a plain forward of each row before the step
    total, count = 0.0, 0
    with torch.no_grad():
        for t in trajs:
            batch = collate([t], tokenizer.pad_token_id)
            logits, _ = model("policy", batch.input_ids, batch.attention_mask)  # [1, T, V]
            logp = torch.log_softmax(logits[0, :-1].float(), -1)  # [T-1, V]
            h = -(logp.exp() * logp).sum(-1)
            keep = batch.loss_mask[0].bool()
            total, count = total + float(h[keep].sum()), count + int(keep.sum())
    adv = [[0.5] * len(ep.steps) for ep in EPISODES]
    batch = update_batch(trajs, items, adv, torch.tensor([1.0, 0.0]))
    stats = update(train, batch, cfg, tokenizer.pad_token_id)
    assert train.global_step == 1
    assert stats["entropy"] == pytest.approx(total / count, rel=1e-4)
    assert stats["lr"] == 2e-3 and stats["lr/rubric"] == 1e-3 and stats["lr/head"] == 5e-3
    assert stats["clip_frac"] == 0.0
    lengths = [len(t.response_ids) for t in trajs]
    assert stats["response_length/mean"] == sum(lengths) / 2
    assert stats["response_length/max"] == max(lengths)
