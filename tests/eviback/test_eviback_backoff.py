"""The trainer's teacher backoff on hand-made rollouts, with the real evidence oracle."""

from __future__ import annotations

import threading

import pytest
import torch

from common.data import QAExample
from common.retrieval.base import Doc
from common.rollout.trajectory import Step, Trajectory
from eviback.backoff import backoff_metrics, backoff_rewards
from eviback.config import TeacherConfig
from eviback.oracle import EvidenceOracle
from eviback.reward import actor_em, scaled_group_advantages
from eviback.teacher import TeacherStats
from eviback.trainer import TeacherOverlap, teacher_backoff, teacher_items

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


def test_overlapped_teacher_gives_the_same_backoff_and_runs_in_the_background():
    """Groups handed over one by one (as run_agent finishes them) are judged in worker threads;
    the result equals the one-call backoff."""
    oracle = EvidenceOracle(5)
    threads: list[str] = []

    class Recording:  # the real oracle, noting which thread judges
        def judge(self, items):
            threads.append(threading.current_thread().name)
            return oracle.judge(items)

    trajs = batch()
    overlap = TeacherOverlap(Recording(), EXAMPLES, workers=2)
    try:
        overlap.submit(trajs[4:])  # q2 has a correct rollout: nothing to ask
        overlap.submit(trajs[:4])
        judged, stats = overlap.collect(trajs)
    finally:
        overlap.close()
    got = backoff_rewards(trajs, judged, stats, TeacherConfig(lam=0.1))
    want = teacher_backoff(batch(), EXAMPLES, oracle, TeacherConfig(lam=0.1))
    assert torch.equal(got.rewards, want.rewards) and torch.equal(got.scales, want.scales)
    assert got.judgements == want.judgements and got.stats == want.stats
    assert len(threads) == 1 and threads[0].startswith("teacher")
    assert overlap.collect(trajs) == ([None] * 6, TeacherStats())  # collected once


def test_teacher_and_oracle_judge_only_the_documents_the_actor_saw():
    """Both supporting documents were retrieved, but the observation limit cut "b" (and half of
    "a"): the oracle sees "a" alone and says I, the teacher item holds the cut text."""
    t = rollout("q1", 0, "Bob", [["a", "b"]])
    t.steps[0].seen = [DOCS["a"]._replace(text="text")]
    asked, items = teacher_items([t], EXAMPLES)
    assert asked == [0] and [list(r.docs) for r in items[0].rounds] == [[t.steps[0].seen[0]]]
    b = teacher_backoff([t], EXAMPLES, EvidenceOracle(5), TeacherConfig())
    assert b.judgements[0].final.status == "I" and b.rewards.tolist() == [0.0]
    # nothing shown at all: no evidence, the teacher is not asked
    t.steps[0].seen = []
    assert teacher_items([t], EXAMPLES) == ([], [])


def test_malformed_correct_rollout_earns_zero_and_keeps_the_backoff():
    """q2's only correct rollout had an invalid turn: with the gate (the default, the release) it
    earns 0, the group is all-zero and falls back to the teacher; without the gate EM = 1."""
    trajs = [
        rollout("q2", 0, "Rome", [["x"]], invalid=1),
        rollout("q2", 1, "Paris", [["x"]]),
    ]
    b = teacher_backoff(trajs, EXAMPLES, EvidenceOracle(5), TeacherConfig(lam=0.1))
    # both supported (x retrieved); only the well-formed one is eligible: 0.1 and 0.1 + 0.1·F1 =
    # 0.1 + 0.1·F1("Rome", ["Rome"]) = 0.2
    assert b.em == [0.0, 0.0] and b.fell_back == [True, True]
    assert b.rewards.tolist() == pytest.approx([0.1, 0.2])
    assert b.scales.tolist() == pytest.approx([0.1, 0.1])
    old = teacher_backoff(trajs, EXAMPLES, EvidenceOracle(5), TeacherConfig(), em_gate=False)
    assert old.em == [1.0, 0.0] and old.rewards.tolist() == [1.0, 0.0] and not any(old.fell_back)
    assert actor_em(trajs[0]) == 0.0 and actor_em(trajs[0], well_formed_only=False) == 1.0
    # a correct answer from a forced-terminated (no answer) trajectory is impossible; one from the
    # forced turn counts: used_forced_turn alone does not make a trajectory malformed
    forced = rollout("q2", 2, "Rome", [["x"]])
    forced.used_forced_turn = True
    assert actor_em(forced) == 1.0


def test_a_failed_teacher_request_is_a_missing_verdict_and_its_group_moves_nothing():
    """The first Stage-A request fails after its retries (no answer); the others say S. Before,
    the failure was scored as "no support" (0) beside the group's supported rollouts (0.2):
    a wrong reward. Now the group is left as if the teacher were off for it: EM (all 0), scale
    1, no fallback, counted."""
    from eviback.prompts import STAGE_A_DEFAULT, STAGE_B_DEFAULT
    from eviback.teacher import TeacherPolicy, TwoStageTeacher

    calls = []

    def backend(batch):
        out = []
        for _ in batch:
            calls.append(1)
            if len(calls) == 1:
                out.append((None, {"error": "HTTP 503 after 4 attempts"}))
            else:
                text = "<reason>r</reason><status>supported_answer</status><answer>Ann</answer>"
                out.append((text, {}))
        return out

    teacher = TwoStageTeacher(backend, TeacherPolicy(STAGE_A_DEFAULT.id, STAGE_B_DEFAULT.id))
    b = teacher_backoff(batch(), EXAMPLES, teacher, TeacherConfig(lam=0.1))
    assert b.rewards.tolist() == [0, 0, 0, 0, 1, 0]
    assert b.scales.tolist() == [1.0] * 6 and not any(b.fell_back)
    assert b.missing_groups == 1 and b.all_zero_groups == 1
    assert b.judgements[0].final.failed and not b.judgements[1].final.failed
    m = backoff_metrics(b)
    # 3 Stage-A requests (1 failed) + 2 Stage-B requests for the two S verdicts
    assert (b.stats.calls_a, b.stats.calls_b, b.stats.failures) == (3, 2, 1)
    assert m["teacher/missing_groups"] == 1 and m["teacher/failure_share"] == pytest.approx(1 / 5)

    calls.clear()
    calls.append(1)  # no failure this time: the same group falls back, 0.1 + 0.1·F1 = 0.2
    b = teacher_backoff(batch(), EXAMPLES, teacher, TeacherConfig(lam=0.1))
    assert b.missing_groups == 0 and b.fell_back[:4] == [True] * 4
    assert b.rewards.tolist()[:3] == pytest.approx([0.2, 0.1, 0.2])
