"""`HFEngine(share_prompt=True)` (``engine.share_prompt``): a prompt sampled n times is prefilled
once and its cache, left-padded beside the batch's other prompts, starts every sample: the same
tokens and log-probs as prefilling every row, and the same caches for CER's scorer."""

from __future__ import annotations

import pytest
import torch

from cer.data import MathExample
from cer.rewards.groups import Group, score_groups
from cer.rewards.scoring import hf_prefix_scorer
from cer.rollout import sample_groups
from common.rollout import HFEngine
from common.rollout.engine import SamplingConfig


def prompts_of(tok) -> list[list[int]]:
    return [tok.encode(t, add_special_tokens=False) for t in ("What is 5 + 7?", "Half of 2?")]


def generate(model, tok, share: bool, params: SamplingConfig) -> list:
    if params.seed is not None:
        torch.manual_seed(params.seed)
    return HFEngine(model, tok, share_prompt=share).generate(prompts_of(tok), params)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shared_prefill_samples_what_the_whole_prefill_samples(
    tiny_qwen3, char_tokenizer, temperature
):
    params = SamplingConfig(n=3, temperature=temperature, max_tokens=12, seed=4)
    shared = generate(tiny_qwen3, char_tokenizer, True, params)
    whole = generate(tiny_qwen3, char_tokenizer, False, params)
    for a_group, b_group in zip(shared, whole, strict=True):
        for a, b in zip(a_group, b_group, strict=True):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs),
                                       atol=1e-5, rtol=0)  # fmt: skip
    if temperature:  # sampling made the group's rows differ: the cache was repeated, not reused
        assert len({tuple(c.token_ids) for c in shared[0]}) > 1


def test_each_prompt_is_prefilled_once(tiny_qwen3, char_tokenizer):
    shapes: list[tuple[int, int]] = []
    hook = tiny_qwen3.model.register_forward_pre_hook(
        lambda m, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    try:
        generate(tiny_qwen3, char_tokenizer, True, SamplingConfig(n=3, temperature=0, max_tokens=4))
    finally:
        hook.remove()
    lengths = [len(p) for p in prompts_of(char_tokenizer)]
    assert shapes[:2] == [(1, lengths[0] - 1), (1, lengths[1] - 1)]
    assert all(s == (6, 1) for s in shapes[2:]) and len(shapes) == 2 + 4


def test_no_prefill_without_a_repeated_prompt(tiny_qwen3, char_tokenizer):
    engine = HFEngine(tiny_qwen3, char_tokenizer, share_prompt=True)
    assert engine._prefilled_cache(prompts_of(char_tokenizer), 15) is None
    assert engine._prefilled_cache([[5], [5]], 1) is None  # one token: nothing before the last


def test_the_scorer_continues_from_a_shared_prefill_as_from_scratch(
    char_tokenizer, model_that_writes_12
):
    tok, model = char_tokenizer, model_that_writes_12
    engine = HFEngine(model, tok, keep_kv=True, share_prompt=True)
    examples = [MathExample("a", "What is 5 + 7?", "12"), MathExample("b", "Half of 2?", "1")]
    params = SamplingConfig(n=4, temperature=1.0, max_tokens=40, seed=0)
    groups = sample_groups(engine, tok, examples, prompts_of(tok), params)
    assert any(
        kv.usable_for(len(s.solution_ids))
        for g in groups
        for kv, s in zip(g.kvs, g.splits, strict=True)
    )
    scorer = hf_prefix_scorer(model, batch_size=3)
    with_kv = score_groups(scorer, groups, tok, None)
    plain = [Group(g.example, g.prompt_ids, g.trajs, g.splits) for g in groups]  # no kvs
    for a, b in zip(with_kv, score_groups(scorer, plain, tok, None), strict=True):
        assert torch.allclose(a[0], b[0], atol=1e-5) and torch.allclose(a[1], b[1], atol=1e-5)
