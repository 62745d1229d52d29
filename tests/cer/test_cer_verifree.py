"""VeriFree as published: the reference replaces the sample's answer and is trained with weight
pi(a* | s); per-token advantages through ``common.rl_loop.policy_update``."""

from __future__ import annotations

import copy

import pytest
import torch

from cer.data import MathExample
from cer.rewards.answer import solution_split
from cer.rewards.groups import Group
from cer.rewards.verifree import verifree_batch
from common.rl_loop import LossConfig, policy_update, token_advantages
from common.rollout.trajectory import Trajectory
from common.train import TrainConfig, TrainEngine


def sampled(tok, text: str, index: int) -> Trajectory:
    ids = tok.encode(text, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    t = Trajectory(
        "g", index, "q", "5 + 7?", ["12"], tok.encode("5 + 7?", add_special_tokens=False)
    )
    t.append(ids, sampled=True, logprobs=[-0.5] * len(ids))
    return t


def test_reference_replaces_the_answer_and_is_weighted_by_its_probability(char_tokenizer):
    tok = char_tokenizer
    trajs = [sampled(tok, "so \\boxed{7}.", 0), sampled(tok, "The total is 7.", 1)]
    splits = [solution_split(t.response_ids, tok) for t in trajs]
    assert [s.answer for s in splits] == ["7", None]
    g = Group(MathExample("q", "5 + 7?", "12", {}), trajs[0].prompt_ids, trajs, splits)
    out, values = verifree_batch([g], torch.tensor([0.25, 0.0]), torch.tensor([0.125, -0.125]), tok)
    n = len(splits[0].solution_ids)
    reference = tok.encode(splits[0].tail + "12}", add_special_tokens=False)
    # sample 0: its solution, then the reference (tail + "12" + "}"), all trained
    assert out[0].response_ids == trajs[0].response_ids[:n] + reference
    assert tok.decode(out[0].response_ids) == "so \\boxed{12}"
    assert out[0].loss_mask == [1] * (n + len(reference))
    assert values[0] == [0.125] * n + [0.25] * len(reference)
    assert out[0].prompt_ids == trajs[0].prompt_ids and out[0].answer == "12"
    # sample 1 (no answer, reward 0): trained as sampled, its advantage on every token
    assert out[1] is trajs[1] and values[1] == [-0.125] * len(trajs[1].response_ids)
    with pytest.raises(ValueError, match="2 samples, 1 rewards"):
        verifree_batch([g], torch.tensor([0.25]), torch.tensor([0.1, 0.2]), tok)


def test_token_advantages_align_with_the_loss_mask():
    a = Trajectory("g", 0, "q", "q", [], [5, 6, 7])
    a.append([8, 9], sampled=True, logprobs=[0.0, 0.0])
    b = Trajectory("g", 1, "q", "q", [], [5])
    b.append([1], sampled=False)
    b.append([2, 3], sampled=True, logprobs=[0.0, 0.0])
    mask = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 0]], dtype=torch.float)  # collate's [B, T-1]
    got = token_advantages([a, b], [[1.5, -2.0], [9.0, 0.5, 0.25]], mask)
    # a: tokens 8, 9 are predicted at positions 2, 3; b: 1 (not trained) at 0, 2 and 3 at 1, 2
    assert got.tolist() == [[0, 0, 1.5, -2.0], [0, 0.5, 0.25, 0]]
    with pytest.raises(ValueError, match="1 token advantages for 2 response tokens"):
        token_advantages([a], [[1.0]], mask[:1])


def test_policy_update_with_per_token_advantages(tiny_qwen3):
    trajs = [Trajectory("g", i, "q", "q", [], [3, 4, 5]) for i in range(2)]
    trajs[0].append([6, 7, 8], sampled=True, logprobs=[0.0] * 3)
    trajs[1].append([9, 10], sampled=True, logprobs=[0.0] * 2)
    cfg = LossConfig(micro_batch_size=2, aggregation="seq_mean_token_sum")

    def update(advantages):
        engine = TrainEngine(copy.deepcopy(tiny_qwen3).train(), TrainConfig(lr=1e-3))
        stats = policy_update(engine, trajs, advantages, cfg, pad_id=0)
        return stats, engine.model.state_dict()

    # on-policy (ratio 1) the loss is -mean over sequences of the summed token advantages
    stats, _ = update([[1.0, 1.0, 2.0], [-1.0, 0.5]])
    assert stats["loss"] == pytest.approx(-((1 + 1 + 2) + (-1 + 0.5)) / 2, abs=1e-6)
    # one advantage per token equal to the sequence's gives the per-sequence update
    _, per_token = update([[0.5] * 3, [-0.25] * 2])
    _, per_sequence = update(torch.tensor([0.5, -0.25]))
    assert all(torch.allclose(v, per_sequence[k]) for k, v in per_token.items())
