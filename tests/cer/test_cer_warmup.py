"""The CER warmup's loss: solution-token NLL plus ``context_weight`` x prompt-token NLL."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from cer.warmup import solution_trajectories
from common.rl import forward_logprobs
from common.rollout.batch import collate
from common.warmup import sft_loss

ROWS = [
    {"id": "a", "problem": "1 + 1?", "solution": "1 + 1 = 2, \\boxed{2}", "answer": "2"},
    {"id": "b", "problem": "What is 5 + 7 and then half?", "solution": "\\boxed{6}", "answer": "6"},
]


@pytest.fixture
def chat_tokenizer(char_tokenizer):
    tok = copy.deepcopy(char_tokenizer)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    return tok


def test_context_weight_adds_the_prompt_token_nll_without_padding(
    tmp_path, chat_tokenizer, tiny_qwen3
):
    path = tmp_path / "warm.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    trajs = solution_trajectories(str(path), chat_tokenizer)
    batch = collate(trajs, chat_tokenizer.pad_token_id)
    lengths = [(len(t.prompt_ids), len(t.prompt_ids) + len(t.response_ids)) for t in trajs]
    assert min(n for _, n in lengths) < batch.input_ids.shape[1]  # one row is padded
    with torch.no_grad():
        logp = forward_logprobs(tiny_qwen3, batch.input_ids, batch.attention_mask)
        # logp[i, j] is the log-prob of token j + 1: prompt tokens 1..p-1, solution p..n-1
        prompt = torch.cat([logp[i, : p - 1] for i, (p, _) in enumerate(lengths)])
        solution = torch.cat([logp[i, p - 1 : n - 1] for i, (p, n) in enumerate(lengths)])
        loss0, nll0 = sft_loss(tiny_qwen3, batch)
        loss1, nll1 = sft_loss(tiny_qwen3, batch, context_weight=0.7)
    assert loss0.item() == pytest.approx(-solution.mean().item(), rel=1e-6)
    assert nll0.item() == nll1.item() == pytest.approx(-solution.mean().item(), rel=1e-6)
    expected = -solution.mean() - 0.7 * prompt.mean()
    assert loss1.item() == pytest.approx(expected.item(), rel=1e-6)
