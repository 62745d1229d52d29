"""The trainer's teacher backoff on hand-made rollouts, with the real evidence oracle."""

from __future__ import annotations

import pytest
import torch

from common.data import QAExample
from common.retrieval.base import Doc
from common.rollout.trajectory import Step, Trajectory
from eviback.config import TeacherConfig
from eviback.oracle import EvidenceOracle
from eviback.reward import scaled_group_advantages
from eviback.trainer import backoff_metrics, teacher_backoff

DOCS = {k: Doc(k, k.title(), f"text of {k}", 1.0) for k in ("a", "b", "x")}
EXAMPLES = {
    "q1": QAExample("q1", "Who?", ["Ann"], {"supporting_ids": ["a", "b"]}),
    "q2": QAExample("q2", "Where?", ["Rome"], {"supporting_ids": ["x"]}),
}


def rollout(qid: str, k: int, answer: str | None, rounds: list[list[str]], invalid: int = 0):
    steps = [Step("search", 0, 1, query=f"q{i}", docs=[DOCS[d] for d in ids])
             for i, ids in enumerate(rounds)]  # fmt: skip
    steps.append(Step("answer", 1, 2))
    ex = EXAMPLES[qid]
    return Trajectory(
        f"g:{qid}", k, qid, ex.question, ex.golden_answers, [1], steps=steps,
        answer=answer, num_invalid=invalid, forced_terminated=answer is None,
    )  # fmt: skip


def batch():
    return [
        # q1: all zero. supported + answered -> 0.1 + 0.1·F1("Ann") = 0.2
        rollout("q1", 0, "Bob", [["a"], ["b"]]),
        # supported but an invalid turn: not eligible -> 0.1
        rollout("q1", 1, "Bob", [["a", "b"]], invalid=1),
        # one supporting document missing -> I -> 0
        rollout("q1", 2, "Bob", [["a", "x"]]),
        # no search -> 0, the teacher is not asked
        rollout("q1", 3, "Bob", []),
        # q2: one correct rollout -> EM for all, no teacher
        rollout("q2", 0, "Rome", [["x"]]),
        rollout("q2", 1, "Paris", [["x"]]),
    ]


def test_backoff_rewards_scales_and_teacher_calls():
    b = teacher_backoff(batch(), EXAMPLES, EvidenceOracle(5), TeacherConfig(lam=0.1))
    assert b.rewards.tolist() == pytest.approx([0.2, 0.1, 0.0, 0.0, 1.0, 0.0])
    assert b.scales.tolist() == pytest.approx([0.1] * 4 + [1.0] * 2)
    assert b.fell_back == [True] * 4 + [False] * 2
    assert [j is not None for j in b.judgements] == [True, True, True, False, False, False]
    assert b.stats.items == 3 and (b.stats.supported, b.stats.insufficient) == (2, 1)
    assert (b.all_zero_groups, b.groups) == (1, 2)
    m = backoff_metrics(b)
    assert m["all_zero_share"] == 0.5
    assert m["teacher/S"] == pytest.approx(2 / 3) and m["teacher/I"] == pytest.approx(1 / 3)
    assert m["backoff_reward_mean"] == pytest.approx(0.3 / 4)
    # λ after normalisation: the fallback group's advantages are 0.1 × the plain z-scores
    adv = scaled_group_advantages(b.rewards, [t.group_id for t in batch()], b.scales)
    r = torch.tensor([0.2, 0.1, 0.0, 0.0])
    z = (r - r.mean()) / (r.std() + 1e-6)
    assert torch.allclose(adv[:4], 0.1 * z, atol=1e-6)


def test_teacher_off_is_the_em_baseline():
    b = teacher_backoff(batch(), EXAMPLES, None, TeacherConfig(enabled=False))
    assert b.rewards.tolist() == [0, 0, 0, 0, 1, 0]
    assert b.scales.tolist() == [1.0] * 6
    assert not any(b.fell_back) and all(j is None for j in b.judgements)
    assert b.stats.items == 0 and backoff_metrics(b)["all_zero_share"] == 0.5
