"""`loss.share_prompt`: a group's prompt forwarded once in the update, its cache repeated for the
G responses, gives the log-probs, gradients and step of the whole forward of every row."""

from __future__ import annotations

import pytest
import torch
import transformers

from common.rl import forward_logprobs, shared_prompt_logprobs
from common.rl_loop import LossConfig, policy_update
from common.rollout.trajectory import Trajectory
from common.run import check_shared_prompt
from common.run_config import SearchRunConfig
from common.train import TrainConfig, TrainEngine

VOCAB = 97


def tiny(arch: str, seed: int = 0) -> transformers.PreTrainedModel:
    torch.manual_seed(seed)
    shape = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=8)  # fmt: skip
    if arch == "llama":  # SmolLM2's architecture
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape)).float()
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**shape)).float()


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return out


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_shared_prompt_logprobs_equal_the_whole_forward_with_the_same_gradients(arch):
    model = tiny(arch)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(1, VOCAB, (7,), generator=g)
    lengths = [5, 2, 1]  # right-padded to 5 (pad id 0)
    response = torch.zeros(3, 5, dtype=torch.long)
    mask = torch.zeros(3, 5, dtype=torch.long)
    for i, n in enumerate(lengths):
        response[i, :n] = torch.randint(1, VOCAB, (n,), generator=g)
        mask[i, :n] = 1
    weights = torch.randn(3, 5, generator=g) * mask  # a loss over the real tokens only

    got = shared_prompt_logprobs(model, prompt, response, mask, chunk_size=4)
    (got * weights).sum().backward()
    shared_grads = grads(model)

    ids = torch.cat([prompt.expand(3, 7), response], dim=1)
    attn = torch.cat([torch.ones(3, 7, dtype=torch.long), mask], dim=1)
    whole = forward_logprobs(model, ids, attn, chunk_size=4)[:, 6:]  # position 6 predicts 7
    (whole * weights).sum().backward()
    whole_grads = grads(model)

    torch.testing.assert_close(got * mask, whole * mask, atol=1e-5, rtol=0)
    assert set(shared_grads) == set(whole_grads) and "model.embed_tokens.weight" in whole_grads
    for name, grad in whole_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_shared_prompt_logprobs_refuse_bad_shapes_and_a_model_without_its_cache():
    model = tiny("qwen3")
    ids = torch.ones(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="P >= 2"):
        shared_prompt_logprobs(model, torch.ones(1, dtype=torch.long), ids, ids)
    with pytest.raises(ValueError, match="must be the same"):
        shared_prompt_logprobs(model, torch.ones(4, dtype=torch.long), ids, ids[:, :2])
    model.gradient_checkpointing_enable()
    model.train()
    with pytest.raises(RuntimeError, match="gradient checkpointing"):
        shared_prompt_logprobs(model, torch.ones(4, dtype=torch.long), ids, ids)


def groups(prompt_lengths: list[int], g: int = 3, seed: int = 0) -> list[Trajectory]:
    """len(prompt_lengths) groups of g responses to one prompt each: uneven sampled spans, an
    inserted span (loss mask 0) in some, one response empty."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for k, p in enumerate(prompt_lengths):
        prompt = torch.randint(1, VOCAB, (p,), generator=gen).tolist()
        for i in range(g):
            t = Trajectory(f"q{k}", i, "q", "q", ["a"], list(prompt))
            if (k, i) == (0, 2):
                out.append(t)  # no response at all
                continue
            r = int(torch.randint(1, 6, (1,), generator=gen))
            t.append(torch.randint(1, VOCAB, (r,), generator=gen).tolist(), sampled=True,
                     logprobs=[-1.0] * r)  # fmt: skip
            if i == 1:
                t.append(torch.randint(1, VOCAB, (2,), generator=gen).tolist(), sampled=False)
                t.append([5], sampled=True, logprobs=[-2.0])
            out.append(t)
    return out


def update(share: bool, trajs: list[Trajectory], mbs: int) -> tuple[dict, dict]:
    engine = TrainEngine(tiny("llama", seed=3), TrainConfig(lr=1e-2, grad_accum=len(trajs) // mbs))
    advantages = torch.randn(len(trajs), generator=torch.Generator().manual_seed(7))
    cfg = LossConfig(micro_batch_size=mbs, logprob_chunk=5, share_prompt=share)
    stats = policy_update(engine, trajs, advantages, cfg, pad_id=0)
    return stats, {k: p.detach().clone() for k, p in engine.model.named_parameters()}


@pytest.mark.parametrize("mbs", [3, 6])  # one group a micro-batch, two groups in one
def test_policy_update_with_a_shared_prompt_takes_the_whole_forwards_step(mbs):
    trajs = groups([6, 4])
    shared_stats, shared_weights = update(True, trajs, mbs)
    whole_stats, whole_weights = update(False, trajs, mbs)
    for key, value in whole_stats.items():
        if key != "tokens/update_forwarded":
            assert shared_stats[key] == pytest.approx(value, abs=1e-5), key
    assert whole_stats["loss"] != 0 and whole_stats["logprob_gap"] > 0
    for name, w in whole_weights.items():
        torch.testing.assert_close(shared_weights[name], w, atol=1e-5, rtol=0, msg=name)
    # the whole forward runs every row's prompt; the shared one each prompt once
    responses = sum(len(t.response_ids) for t in trajs)
    assert whole_stats["tokens/update_forwarded"] == 3 * 6 + 3 * 4 + responses
    assert shared_stats["tokens/update_forwarded"] == 6 + 4 + responses
    assert (
        whole_stats["tokens/update"] == shared_stats["tokens/update"] == 3 * 6 + 3 * 4 + responses
    )


def test_a_one_token_prompt_runs_the_whole_forward():
    trajs = groups([1, 4])
    stats, _ = update(True, trajs, 6)
    assert stats["tokens/update_forwarded"] == stats["tokens/update"]


def test_share_prompt_is_refused_under_checkpointing_and_multi_rank_zero3():
    cfg = SearchRunConfig(loss=LossConfig(share_prompt=True))
    check_shared_prompt(cfg.loss, cfg.train, world=1)
    cfg.train.zero_stage = 3
    check_shared_prompt(
        cfg.loss, cfg.train, world=1
    )  # ZeRO-3 on one rank: one rank, no one to wait for
    with pytest.raises(ValueError, match="ZeRO-3 on 2 ranks"):
        check_shared_prompt(cfg.loss, cfg.train, world=2)
    cfg.train.zero_stage = 2
    check_shared_prompt(cfg.loss, cfg.train, world=2)
    cfg.train.gradient_checkpointing = True
    with pytest.raises(ValueError, match="gradient_checkpointing=false"):
        check_shared_prompt(cfg.loss, cfg.train, world=1)
    cfg.loss.share_prompt = False
    check_shared_prompt(cfg.loss, cfg.train, world=1)
