"""``experiments.step_scorers.TeacherEvidenceSteps`` on hand-built trajectories (the evidence
oracle: S once every supporting document was retrieved), ARCO's dense advantages from it, and
``reward.step_scorer``'s checks in ARCO's config and trainer."""

from __future__ import annotations

from pathlib import Path

import pytest

from arco.advantages import dense_advantages
from arco.config import ArcoConfig
from arco.trainer import external_step_scores
from common.config import ConfigError, load_config
from common.data import QAExample
from common.retrieval.base import Doc
from common.rewards import RewardContext, groups_of
from common.rollout.trajectory import Step, Trajectory
from experiments.step_scorers import TeacherEvidenceSteps

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {"q": QAExample("q", "Where was X born?", ["Oslo"], {"supporting_ids": ["a", "b"]})}


def search(*ids: str) -> Step:
    return Step("search", 0, 1, query="x", docs=[Doc(i, i, i, 1.0) for i in ids])


def traj(k: int, steps: list[Step], answer: str | None) -> Trajectory:
    return Trajectory("g", k, "q", "Where was X born?", ["Oslo"], [1], steps=steps,
                      answer=answer, forced_terminated=answer is None)  # fmt: skip


def batch() -> list[Trajectory]:
    return [
        # evidence complete at its second search, answered right
        traj(0, [search("a"), search("b"), Step("answer", 1, 2)], "Oslo"),
        # complete at the first search (both documents), then searches again, answers wrong
        traj(1, [search("a", "b"), search("c"), Step("answer", 1, 2)], "Bergen"),
        # an invalid turn, one document only, then the right answer
        traj(2, [Step("invalid", 0, 1), search("b"), Step("answer", 1, 2)], "oslo"),
        # never answers
        traj(3, [search("c"), Step("invalid", 0, 1)], None),
    ]


def test_the_teacher_credits_the_search_that_completed_the_evidence_and_the_answer_its_em():
    ctx = RewardContext(examples=EXAMPLES)
    scores = TeacherEvidenceSteps(beta=0.1)(groups_of(batch()), ctx)
    assert scores == [[0.0, 0.1, 1.0], [0.1, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0]]  # 0.1·1 exact
    # top_m 1 cuts each round to its first document: trajectory 1 never sees b
    one = TeacherEvidenceSteps(beta=0.1, top_m=1)(groups_of(batch()), ctx)
    assert one[1] == [0.0, 0.0, 0.0] and one[0] == [0.0, 0.1, 1.0]
    with pytest.raises(ValueError, match=r"needs ctx.examples"):
        TeacherEvidenceSteps()(groups_of(batch()), RewardContext())


def test_arco_s_dense_advantages_from_the_teacher_s_step_scores_by_hand():
    trajs = batch()
    scores = TeacherEvidenceSteps()(groups_of(trajs), RewardContext(examples=EXAMPLES))
    kinds = [[s.kind for s in t.steps] for t in trajs]
    adv = dense_advantages(scores, kinds, c=0.5)
    # G: [1.1, 1.1, 1.0], [0.1, 0, 0], [1, 1, 1], [0, 0]. Buckets: search_1 {1.1, 0.1, 1.0
    # (trajectory 2's search is its first), 0} -> 0.55; search_2 {1.1, 0} -> 0.55; terminal
    # {1.0, 0, 1.0, 0 (trajectory 3's last step)} -> 0.5; invalid {1.0} alone -> the batch
    # mean of every G, 6.3 / 11
    m = 6.3 / 11
    want = [[0.5 * (1.1 - 0.55), 0.5 * (1.1 - 0.55), 0.5 * (1.0 - 0.5)],
            [0.5 * (0.1 - 0.55), 0.5 * (0.0 - 0.55), 0.5 * (0.0 - 0.5)],
            [0.5 * (1.0 - m), 0.5 * (1.0 - 0.55), 0.5 * (1.0 - 0.5)],
            [0.5 * (0.0 - 0.55), 0.5 * (0.0 - 0.5)]]  # fmt: skip
    for got, w in zip(adv, want, strict=True):
        assert got == pytest.approx(w)


def test_external_step_scores_are_checked_one_per_step():
    trajs = batch()
    ctx = RewardContext()
    ok = external_step_scores(lambda g, c: [[0.0] * len(t.steps) for t in trajs], trajs, ctx, "f")
    assert [len(s) for s in ok] == [3, 3, 3, 2]
    with pytest.raises(ValueError, match=r"reward.step_scorer='f' gave 1 score lists for 4"):
        external_step_scores(lambda g, c: [[0.0]], trajs, ctx, "f")
    with pytest.raises(ValueError, match=r"trajectory 3: 3 scores for 2 steps"):
        external_step_scores(lambda g, c: [[0.0] * 3] * 4, trajs, ctx, "f")
    nan = [[0.0] * 3] * 3 + [[0.0, float("nan")]]
    with pytest.raises(ValueError, match="or one not finite"):
        external_step_scores(lambda g, c: nan, trajs, ctx, "f")


def test_arco_s_step_scorer_is_checked_when_the_config_is_built():
    cfg = load_config(
        ArcoConfig, None, ["reward.step_scorer=experiments.step_scorers:TeacherEvidenceSteps"]
    )
    assert isinstance(cfg.reward.scorer(), TeacherEvidenceSteps)
    assert cfg.mu_frozen and not cfg.uses_mu and not cfg.rl.freeze_rubric  # the key as given
    default = load_config(ArcoConfig, None, [])
    assert default.reward.step_scorer == "rubric" and default.reward.scorer() is None  # μ
    assert default.uses_mu and not default.mu_frozen
    with pytest.raises(ConfigError, match="reward.step_scorer='nope:x' does not import"):
        load_config(ArcoConfig, None, ["reward.step_scorer=nope:x"])
    with pytest.raises(ConfigError, match="method=prm has none of its own to replace"):
        load_config(ArcoConfig, None, ["reward.step_scorer=experiments.step_scorers:"
                                       "TeacherEvidenceSteps", "method=prm"])  # fmt: skip


def test_the_old_rl_step_scorer_keys_fail_in_one_line_naming_the_new_ones():
    for old, value in (("rl.step_scorer", "rubric"), ("rl.step_scorer_args", "{beta: 1}")):
        with pytest.raises(ConfigError) as e:
            load_config(ArcoConfig, None, [f"{old}={value}"])
        new = old.replace("rl.", "reward.")
        assert str(e.value) == (
            f"config key {old!r} (from the command line) was renamed: use {new!r} "
            "(docs/configuration.md)"
        )


def test_the_compare_spec_sets_the_teacher_s_steps_against_mu_and_outcome_only():
    from experiments.compare import load_spec

    spec = load_spec(ROOT / "arco" / "configs" / "compare_step_scorer.yaml")
    assert [a["name"] for a in spec["arms"]] == ["outcome_only", "arco", "teacher_steps"]
    assert (spec["seeds"], spec["baseline"]) == ([0, 1, 2], "outcome_only")
    cfgs = {}
    for arm in spec["arms"]:
        over = [o.replace("{out}", "runs/x") for o in arm["overrides"]]
        cfgs[arm["name"]] = load_config(ArcoConfig, ROOT / arm["command"][-1], over)
    assert {n: c.warmup_dir for n, c in cfgs.items()} == dict.fromkeys(cfgs, "runs/x/warmup/arco")
    assert cfgs["arco"].reward.step_scorer == "rubric" and cfgs["outcome_only"].dense_steps == 0
    assert isinstance(cfgs["teacher_steps"].reward.scorer(), TeacherEvidenceSteps)
    assert cfgs["teacher_steps"].dense_steps == cfgs["arco"].dense_steps == 10
