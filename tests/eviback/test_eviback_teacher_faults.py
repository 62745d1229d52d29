"""EviBack's two-stage teacher against the stand-in endpoint's faults, through the real
LLM client on loopback, on hand-made rollouts: one stage down, a reply from another model, a
reply that breaks the verdict contract; and the per-stage stop they lead to."""

from __future__ import annotations

import httpx
import pytest

from common.config import load_config
from common.data import QAExample
from common.launcher import RunStopped
from common.llm_client import LLMClient
from common.retrieval.base import Doc
from common.rollout.trajectory import Step, Trajectory
from eviback.backoff import backoff_metrics
from eviback.cli import DEFAULT_CONFIG
from eviback.config import EviBackConfig, TeacherConfig
from eviback.prompts import STAGE_A_DEFAULT, STAGE_B_DEFAULT
from eviback.teacher import TeacherPolicy, TwoStageTeacher
from eviback.trainer import check_teacher_failures, teacher_backoff
from experiments.rehearse.endpoint import serve_endpoint

QUESTION = "Where was the director of The Glass Orchard born?"
EXAMPLES = {"q1": QAExample("q1", QUESTION, ["Paris"])}
PARIS = Doc("d1", "Mira Kovalenko", "Mira Kovalenko was born in Paris.", 1.0)
FILM = Doc("d2", "The Glass Orchard", "The Glass Orchard was directed by Mira Kovalenko.", 0.9)
LIND = Doc("d3", "Vera Lind", "Vera Lind, who directed it too, was born in Paris.", 0.8)
POLICY = TeacherPolicy(STAGE_A_DEFAULT.id, STAGE_B_DEFAULT.id)


def rollout(k: int, docs: list[Doc]) -> Trajectory:
    """A well-formed rollout of q1 that searched ``docs`` and answered wrong ("Rome")."""
    steps = [Step("search", 0, 1, query="director", docs=docs), Step("answer", 1, 2)]
    return Trajectory(
        "g:q1", k, "q1", QUESTION, ["Paris"], [1], steps=steps, answer="Rome",
        num_invalid=0, forced_terminated=False,
    )  # fmt: skip


GROUP = [rollout(0, [PARIS]), rollout(1, [FILM, PARIS]), rollout(2, [LIND])]


def teacher(url: str, **kw) -> TwoStageTeacher:
    return TwoStageTeacher(LLMClient(url, "judge", retries=1, backoff=0.01, **kw), POLICY)


def by_contract(url: str, contract: str) -> dict[str, int]:
    stats = httpx.get(url.removesuffix("/v1") + "/stats").json()
    return {k: v for k, v in stats["by_contract"][contract].items() if v}


def config(url: str, *extra: str) -> EviBackConfig:
    keys = [f"assets.teacher_endpoint={url}", "assets.teacher_model=judge", *extra]
    return load_config(EviBackConfig, DEFAULT_CONFIG, keys)


def test_the_group_is_judged_and_falls_back_on_a_healthy_endpoint():
    """The baseline of the tests below: each rollout's evidence states Paris, stage A and B say
    S "Paris": r = β + γ·F1 = 0.1 + 0.1 = 0.2 for each of the three, scale λ."""
    with serve_endpoint() as url:
        b = teacher_backoff(GROUP, EXAMPLES, teacher(url), TeacherConfig(lam=0.1))
    assert b.rewards.tolist() == pytest.approx([0.2, 0.2, 0.2])
    assert b.fell_back == [True] * 3 and b.scales.tolist() == pytest.approx([0.1] * 3)
    assert (b.stats.calls_a, b.stats.calls_b, b.stats.invalid_a, b.stats.invalid_b) == (3, 3, 0, 0)


def test_a_broken_reply_is_asked_again_then_is_a_missing_verdict_never_a_zero(tmp_path):
    """Stage A's reply about Vera Lind's page breaks the contract every time. Before, it was asked
    once and scored 0 beside the two supported rollouts' 0.2 (advantage -1.15 x λ: the rollout
    punished for the teacher's format). Now it is asked 1 + teacher.contract_retries (2) times,
    then the verdict is missing: its group is left at EM (0, 0, 0; scale 1; it moves nothing)."""
    with serve_endpoint(
        malformed=1.0, fail_only=("eviback_stage_a",), fail_matching=["Lind"]
    ) as url:
        t = teacher(url, reasks=2, cache_dir=tmp_path)
        b = teacher_backoff(GROUP, EXAMPLES, t, TeacherConfig(lam=0.1))
        assert by_contract(url, "eviback_stage_a") == {"ok": 2, "malformed": 3}
    assert b.rewards.tolist() == [0.0, 0.0, 0.0] and not any(b.fell_back)
    assert b.scales.tolist() == [1.0, 1.0, 1.0] and b.missing_groups == 1
    final = b.judgements[2].final
    assert final.failed and not final.valid and final.error.startswith("parse:")
    assert (b.stats.broken, b.stats.failures, b.stats.invalid_a) == (1, 0, 1)
    assert len(list(tmp_path.rglob("*.json"))) == 4  # 2 + 2 answers cached, not the broken one
    assert backoff_metrics(b)["teacher/broken"] == 1


def test_a_reply_from_another_model_is_a_missing_verdict_never_cached(tmp_path):
    """The endpoint answers as "another-judge" (a restarted server, a proxy): before, its
    verdicts were taken and cached. Now each is refused (not retried, not cached), counted, and
    stage A's share of unusable verdicts (3 of 3) stops the run."""
    with serve_endpoint(reply_model="another-judge") as url:
        b = teacher_backoff(
            GROUP, EXAMPLES, teacher(url, cache_dir=tmp_path), TeacherConfig(lam=0.1)
        )
        assert by_contract(url, "eviback_stage_a") == {"ok": 3}  # one request each
        cfg = config(url)
    assert all(j.final.failed for j in b.judgements)
    assert "came from model 'another-judge', not 'judge'" in b.judgements[0].final.error
    assert (b.stats.wrong_model, b.stats.invalid_a, b.stats.calls_b) == (3, 3, 0)
    assert not list(tmp_path.rglob("*.json"))
    assert b.rewards.tolist() == [0.0, 0.0, 0.0] and b.missing_groups == 1
    with pytest.raises(RunStopped, match=r"^step 4: 100% of the teacher's stage A \(gold-blind\)"):
        check_teacher_failures(4, [3, 3, 0, 0], cfg.teacher, cfg.assets)
    with serve_endpoint(reply_model="zai-org/judge-2025-01-01") as url:  # prefix, dated
        b = teacher_backoff(GROUP, EXAMPLES, teacher(url), TeacherConfig(lam=0.1))
    assert b.rewards.tolist() == pytest.approx([0.2, 0.2, 0.2]) and b.stats.wrong_model == 0


def test_a_dead_stage_b_stops_though_the_stages_together_fail_only_half():
    """Stage B (gold-aware) answers 503 to everything, stage A is well: 3 of the 6 requests fail,
    a share of exactly 0.5, which never passed teacher.max_failure_share=0.5, and the run trained
    on stage A's verdicts alone (merge rule 3). Stage B's own share is 3 of 3: the run stops."""
    with serve_endpoint(http_503=1.0, fail_only=("eviback_stage_b",)) as url:
        b = teacher_backoff(GROUP, EXAMPLES, teacher(url), TeacherConfig(lam=0.1))
        assert by_contract(url, "eviback_stage_b") == {"http_503": 6}  # 3 x (1 + 1 retry)
        cfg = config(url)
    s = b.stats
    assert (s.calls_a, s.invalid_a, s.calls_b, s.invalid_b) == (3, 0, 3, 3)
    assert (s.failure_share, s.failure_share_a, s.failure_share_b) == (0.5, 0.0, 1.0)
    assert [j.final.status for j in b.judgements] == ["S", "S", "S"]  # stage A's, rule 3
    with pytest.raises(RunStopped) as stop:
        check_teacher_failures(3, [0, 3, 3, 3], cfg.teacher, cfg.assets)
    assert str(stop.value) == (
        f"step 3: 100% of the teacher's stage B (gold-aware) requests (3 over all ranks) to {url} "
        "(model judge) failed after their retries, came from another model or broke the verdict "
        "contract, over teacher.max_failure_share=0.5 (each stage on its own); stage A "
        "(gold-blind): 0% of 3; the warnings above name the errors"
    )
    check_teacher_failures(3, [0, 4, 2, 4], cfg.teacher, cfg.assets)  # 50%: not over the share
    lenient = config(url, "teacher.max_failure_share=1")
    check_teacher_failures(3, [0, 3, 3, 3], lenient.teacher, lenient.assets)
