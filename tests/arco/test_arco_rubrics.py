"""Rubrics for a batch (one engine call, invalid ones counted) and the trainer's token layouts."""

from __future__ import annotations

import pytest
import torch

from arco.rubrics import RubricItem, rubric_batch, step_rewards, write_criteria
from arco.trainer import _per_token, _place
from common.rollout.engine import Completion
from common.rollout.trajectory import Step, Trajectory

EOS = 9


class ScriptedEngine:
    """Answers each prompt with a canned text; records the calls."""

    def __init__(self, texts: list[str]):
        self.texts = texts
        self.calls: list[tuple[int, str | None, float]] = []

    def generate(self, prompts, params, adapter=None):
        self.calls.append((len(prompts), adapter, params.temperature))
        return [
            [Completion([len(text)] + ([EOS] if i % 2 else []), [0.0], text, "stop")]
            for i, text in enumerate(self.texts[: len(prompts)])
        ]


def test_criteria_for_a_whole_batch_in_one_greedy_rubric_call():
    items = [RubricItem(traj=i // 2, step=i % 2, prompt_ids=[1, 2, 3 + i]) for i in range(4)]
    engine = ScriptedEngine(
        [
            '{"criteria": ["a", "b"]}',
            "not json at all",
            '{"criteria": ["a", ""]}',
            '```json\n{"criteria": ["x", "y"]}\n```',
        ]
    )
    invalid = write_criteria(engine, items, k=2, max_new_tokens=16, eos_id=EOS)
    assert engine.calls == [(4, "rubric", 0.0)]
    assert invalid == 2
    assert [it.criteria for it in items] == [["a", "b"], None, None, ["x", "y"]]
    # EOS closes every sequence exactly once
    assert [it.criteria_ids[-1] for it in items] == [EOS] * 4
    assert [it.criteria_ids.count(EOS) for it in items] == [1] * 4


def test_rubric_batch_masks_exactly_the_criteria_tokens():
    items = [
        RubricItem(0, 0, [1, 2, 3], criteria_ids=[4, 5]),
        RubricItem(0, 1, [1, 2], criteria_ids=[6]),
    ]
    ids, attn, crit = rubric_batch(items, pad_id=0, device=torch.device("cpu"))
    assert ids.tolist() == [[1, 2, 3, 4, 5], [1, 2, 6, 0, 0]]
    assert attn.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    # position t predicts token t+1: row 0 predicts 4, 5 from positions 2, 3
    assert crit.tolist() == [[0, 0, 1, 1], [0, 1, 0, 0]]


def test_step_rewards_are_the_mean_of_the_k_scores_in_step_order():
    items = [
        RubricItem(0, 0, [], scores=[0.5, -0.5, 1.0]),
        RubricItem(0, 1, [], scores=[0.0, 0.0, 0.3]),
        RubricItem(1, 0, [], scores=[-0.3, -0.3, -0.3]),
    ]
    got = step_rewards(items, 2)
    assert got == [[pytest.approx(1 / 3), pytest.approx(0.1)], [pytest.approx(-0.3)]]


def test_step_advantages_land_on_the_step_sampled_tokens():
    t = Trajectory("g", 0, "q", "Q", ["a"], prompt_ids=[7, 7, 7])
    t.append([1, 2], sampled=True, logprobs=[0.0, 0.0])
    t.steps.append(Step("search", 0, 2))
    t.append([3, 3, 3], sampled=False)  # observation
    t.append([4], sampled=True, logprobs=[0.0])
    t.steps.append(Step("answer", 5, 6))
    assert _per_token(t, [0.5, -1.0]) == [0.5, 0.5, 0.0, 0.0, 0.0, -1.0]
    placed = _place([t], [_per_token(t, [0.5, -1.0])], width=9)
    # response token j is predicted at column len(prompt) - 1 + j = 2 + j
    assert placed.tolist() == [[0, 0, 0.5, 0.5, 0, 0, 0, -1.0]]
