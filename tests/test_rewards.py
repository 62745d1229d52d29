"""common.rewards: the reward, step scorer and estimator as parts. The built-ins equal the
functions they replace on hand-built groups (the search agent's EM, GRPO; EviBack's backoff);
reward.fn and reward.advantage are checked when the config is built; a user's reward by import
path trains the search GRPO loop."""

from __future__ import annotations

import json
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from common.config import ConfigError, load_config
from common.data import QAExample
from common.retrieval.base import Doc
from common.rewards import (
    Group,
    RewardContext,
    Rewards,
    check_step_scores,
    exact_match,
    f1,
    groups_of,
    grpo,
    load_part,
    rloo,
    spread_to_tokens,
    step_layout,
)
from common.rl import group_normalized_advantages, rloo_advantages
from common.rl_loop import em_rewards
from common.rollout.trajectory import Step, Trajectory
from common.search_grpo import GRPOConfig

ROOT = Path(__file__).resolve().parents[1]
CTX = RewardContext()


def traj(group: str, k: int, answer: str | None, gold: list[str], docs: list[str] = ()):
    steps = [Step("search", 0, 1, query="q", docs=[Doc(d, d, d, 1.0) for d in docs]),
             Step("answer", 1, 2)]  # fmt: skip
    return Trajectory(group, k, group, f"question {group}?", gold, [1], steps=steps,
                      answer=answer, forced_terminated=answer is None)  # fmt: skip


def batch() -> list[Trajectory]:
    return [
        traj("a", 0, "Paris", ["Paris"]),
        traj("a", 1, "the paris", ["Paris"]),  # SQuAD normalisation: EM 1
        traj("a", 2, "Paris France", ["Paris"]),  # F1 = 2·(1/2)·1 / (1/2 + 1) = 2/3
        traj("a", 3, None, ["Paris"]),
        traj("b", 0, "Rome", ["Milan"]),
        traj("b", 1, "Milan", ["Milan"]),
    ]


def test_groups_of_keeps_batch_order_and_refuses_split_groups():
    gs = groups_of(batch())
    assert [len(g.trajectories) for g in gs] == [4, 2]
    assert gs[0].predictions == ["Paris", "the paris", "Paris France", None]
    assert gs[1].golden_answers == ["Milan"] and gs[1].aliases == [] and gs[1].source is None
    t = batch()
    with pytest.raises(ValueError, match="'a' is not contiguous"):
        groups_of([t[0], t[4], t[1]])


def test_exact_match_and_f1_by_hand_and_equal_to_the_loop_s_old_reward():
    trajs = batch()
    em = exact_match(groups_of(trajs), CTX)
    assert em.values.tolist() == [1, 1, 0, 0, 0, 1] and em.metrics == {}
    assert torch.equal(em.values, em_rewards(trajs))  # the GRPO loop's reward before
    assert f1(groups_of(trajs), CTX).values.tolist() == pytest.approx([1, 1, 2 / 3, 0, 0, 1])
    # aliases count as gold answers
    g = Group("q", ["Milan"], ["Milano"], [], ["milano", "Rome"])
    assert exact_match([g], CTX).values.tolist() == [1, 0]


def test_grpo_and_rloo_by_hand_and_equal_to_common_rl():
    r = Rewards(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0]))
    ids = ["a", "a", "a", "a", "b", "b"]
    # group a: mean 1/4, std (ddof 1) sqrt((9/16 + 3/16) / 3) = 1/2; group b: equal rewards -> 0
    want = torch.tensor([1.5, -0.5, -0.5, -0.5, 0.0, 0.0])
    assert torch.allclose(grpo(r, ids), want, atol=1e-5)
    assert torch.equal(grpo(r, ids, None), group_normalized_advantages(r.values, ids))
    # rloo: 1 - 0 = 1, 0 - 1/3 for the others; b: 1 - 1 = 0
    assert torch.allclose(rloo(r, ids), torch.tensor([1, -1 / 3, -1 / 3, -1 / 3, 0, 0]))
    assert torch.equal(rloo(r, ids), rloo_advantages(r.values, ids))


def backoff_case(lam: float = 0.1):
    """Two groups for EviBack's backoff: ``a`` has a correct rollout, ``c`` is all zero (the
    evidence oracle's verdicts); the trajectories, their examples and the reward's ctx."""
    from eviback.backoff import TeacherVerdicts
    from eviback.config import TeacherConfig
    from eviback.oracle import EvidenceOracle
    from eviback.trainer import teacher_verdicts

    examples = {
        "a": QAExample("a", "question a?", ["Paris"], {"supporting_ids": ["p"]}),
        "c": QAExample("c", "question c?", ["Oslo"], {"supporting_ids": ["o", "n"]}),
    }
    trajs = [
        traj("a", 0, "Paris", ["Paris"], ["p"]),  # a correct rollout: EM for the group
        traj("a", 1, "Lyon", ["Paris"], ["p"]),
        traj("c", 0, "Bergen", ["Oslo"], ["o", "n"]),  # all zero: supported, 0.1 + 0.1·F1
        traj("c", 1, "Bergen", ["Oslo"], ["o"]),  # one document missing: I -> 0
        traj("c", 2, "Bergen", ["Oslo"], []),  # no evidence: 0, not asked
    ]
    teacher, cfg = EvidenceOracle(5), TeacherConfig(lam=lam)
    judged, stats = teacher_verdicts(trajs, examples, teacher)
    verdicts = TeacherVerdicts(judged, stats, em_gate=True, config=cfg)
    return trajs, examples, teacher, cfg, RewardContext(teacher=verdicts)


def test_eviback_backoff_through_the_parts_equals_the_trainer_s_old_path():
    """The old path: teacher_backoff + scaled_group_advantages (the trainer before); the new:
    the verdicts handed to reward.fn=eviback, then reward.advantage=backoff."""
    from eviback.backoff import backoff_advantages, backoff_metrics, teacher_backoff_reward
    from eviback.reward import scaled_group_advantages
    from eviback.trainer import teacher_backoff

    trajs, examples, teacher, cfg, ctx = backoff_case()
    ids = [t.group_id for t in trajs]
    old = teacher_backoff(trajs, examples, teacher, cfg)
    old_adv = scaled_group_advantages(old.rewards, ids, old.scales)
    new = teacher_backoff_reward(groups_of(trajs), ctx)
    assert torch.equal(new.values, old.rewards)
    assert torch.equal(new.extras["advantage_scale"], old.scales)
    assert new.metrics == backoff_metrics(old)
    assert torch.equal(backoff_advantages(new, ids, None), old_adv)
    # by hand: a keeps EM; c0 supported and eligible, the oracle answers the gold: 0.1 + 0.1·1
    assert new.values.tolist() == pytest.approx([1.0, 0.0, 0.2, 0.0, 0.0])
    assert new.extras["advantage_scale"].tolist() == pytest.approx([1, 1, 0.1, 0.1, 0.1])
    # λ after normalisation: group c's advantages are 0.1 × its z-scores
    r = new.values[2:]
    z = (r - r.mean()) / (r.std() + 1e-6)
    assert torch.allclose(backoff_advantages(new, ids)[2:], 0.1 * z, atol=1e-6)
    # no scale from the reward (EM): plain GRPO, ddof 1
    em = exact_match(groups_of(trajs), CTX)
    assert torch.allclose(backoff_advantages(em, ids), grpo(em, ids), atol=1e-6)


def test_backoff_over_a_base_reward_replaces_em_where_no_group_falls_back():
    """reward.base: group a (a correct rollout) takes the base's rewards, group c (all zero,
    the teacher on) the teacher's with λ; with the teacher off every group is the base's."""
    from eviback.backoff import BackoffOver, backoff_advantages, teacher_backoff_reward

    trajs, _, _, _, ctx = backoff_case(lam=0.3)
    trajs[1].answer = "Paris France"  # F1 2/3, EM 0: group a still has a correct rollout
    groups = groups_of(trajs)
    out = BackoffOver(f1)(groups, ctx)
    plain = teacher_backoff_reward(groups, ctx)
    assert out.values.tolist() == pytest.approx([1.0, 2 / 3, 0.2, 0.0, 0.0])
    assert plain.values.tolist() == pytest.approx([1.0, 0.0, 0.2, 0.0, 0.0])  # EM in a
    assert out.extras["advantage_scale"].tolist() == pytest.approx([1, 1, 0.3, 0.3, 0.3])
    assert out.metrics == plain.metrics  # f1 counts nothing; the backoff's metrics unchanged
    assert torch.equal(out.extras["backoff"].rewards, out.values)  # what samples/ shows
    ids = [t.group_id for t in trajs]
    # group a: rewards 1, 2/3, mean 5/6, std (ddof 1) sqrt(2)/6: z = ±1/sqrt(2)
    adv = backoff_advantages(out, ids)
    assert adv[:2].tolist() == pytest.approx([2**-0.5, -(2**-0.5)], abs=1e-5)
    off = RewardContext(teacher=replace(ctx.teacher, config=None))
    assert torch.equal(BackoffOver(f1)(groups, off).values, f1(groups, CTX).values)
    with pytest.raises(ValueError, match=r"reward.base gave \(2,\) rewards for 5 rollouts"):
        BackoffOver(lambda g, c: Rewards(torch.zeros(2)))(groups, ctx)


def test_reward_base_is_checked_and_built_from_the_config():
    from eviback.backoff import BackoffOver, reward_of, teacher_backoff_reward

    cls = _eviback_config()
    assert reward_of(load_config(cls, None, []).reward) is teacher_backoff_reward
    cfg = load_config(cls, None, ["reward.base=f1"])
    fn = reward_of(cfg.reward)
    assert isinstance(fn, BackoffOver) and fn.base is f1
    with pytest.raises(ConfigError, match="reward.base='f1' is the base under EviBack's backoff"):
        load_config(cls, None, ["reward.base=f1", "reward.fn=exact_match"])
    with pytest.raises(ConfigError, match="reward.base='nope' is neither a built-in"):
        load_config(cls, None, ["reward.base=nope"])
    with pytest.raises(ConfigError, match="cannot be its own base"):
        load_config(cls, None, ["reward.base=eviback"])


USER_REWARDS = '''
    import torch
    from common.rewards import Rewards

    def answered(groups, ctx):
        """1 for every rollout with an answer, and the rollouts it counted."""
        values = [float(p is not None) for g in groups for p in g.predictions]
        return Rewards(torch.tensor(values), {"answered_count": float(len(values))})

    class Halved:
        def __call__(self, groups, ctx):
            return Rewards(torch.tensor([0.5 for g in groups for _ in g.predictions]))

    def two_args(groups):
        return None

    def flat_advantages(rewards, group_ids, step_scores):
        return rewards.values - rewards.values.mean()

    NOT_CALLABLE = 3

    SEEN = []

    class SearchesPay:
        """s_t = 0.25 for a search, the EM for the answer step, 0 otherwise; records its input."""

        def __call__(self, groups, ctx):
            SEEN.append(sorted(ctx.examples)[:1])
            out = []
            for g in groups:
                for t in g.trajectories:
                    hit = t.answer is not None and t.answer in t.golden_answers
                    out.append([0.25 if s.kind == "search" else float(hit and s.kind == "answer")
                                for s in t.steps])
            return out

    class Recorded:
        """ARCO's dense advantages, and what they were computed from."""

        CALLS = []

        def __call__(self, rewards, group_ids, step_scores):
            from arco.advantages import DenseAdvantages

            out = DenseAdvantages()(rewards, group_ids, step_scores)
            Recorded.CALLS.append((dict(rewards.extras), step_scores, out))
            return out

        needs_step_scores = True

    def old_em(groups, ctx):
        """The reference loop's reward before the parts (common.rl_loop.em_rewards)."""
        from common.rl_loop import em_rewards

        return Rewards(em_rewards([t for g in groups for t in g.trajectories]))

    def old_grpo(rewards, group_ids, step_scores):
        """The reference loop's advantages before the parts."""
        from common.rl import group_normalized_advantages

        return group_normalized_advantages(rewards.values, group_ids)

    class Picky:
        def __init__(self, level=0):
            if level < 0:
                raise ValueError("picky says no")

        def __call__(self, groups, ctx):
            return []
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent(USER_REWARDS))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards"


def test_load_part_resolves_built_ins_paths_and_classes(user_module):
    from common.rewards import ESTIMATORS, REWARDS

    assert load_part("f1", "reward.fn", "reward", REWARDS) is f1
    assert load_part("rloo", "reward.advantage", "estimator", ESTIMATORS) is rloo
    assert load_part("common.rewards:exact_match", "reward.fn", "reward", REWARDS) is exact_match
    halved = load_part("my_rewards:Halved", "reward.fn", "reward", REWARDS)  # instantiated
    assert halved([Group("q", ["x"], [], [], ["x", None])], CTX).values.tolist() == [0.5, 0.5]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("reward.fn=exactmatch", r"reward.fn='exactmatch' is neither a built-in "
         r"\(exact_match, f1(, eviback)?\) nor package.module:Name"),
        ("reward.fn=no_such_module:fn", "reward.fn='no_such_module:fn' does not import: "
         "ModuleNotFoundError: No module named 'no_such_module'"),
        ("reward.fn=my_rewards:missing", "reward.fn='my_rewards:missing' does not import: "
         "AttributeError"),
        ("reward.fn=my_rewards:NOT_CALLABLE", r"reward.fn='my_rewards:NOT_CALLABLE' is not "
         r"callable \(int\)"),
        ("reward.fn=my_rewards:two_args", r"reward.fn='my_rewards:two_args' has the wrong "
         r"signature: a reward is called as \(groups, ctx\), it takes \(groups\)"),
        ("reward.advantage=my_rewards:answered", r"reward.advantage='my_rewards:answered' has "
         r"the wrong signature: an estimator is called as \(rewards, group_ids, step_scores\)"),
    ],
)  # fmt: skip
def test_a_bad_reward_is_one_line_naming_the_key(user_module, override, message):
    for cls in (GRPOConfig, _eviback_config()):
        with pytest.raises(ConfigError, match=message) as e:
            load_config(cls, None, [override])
        assert "\n" not in str(e.value) and "from the command line" in str(e.value)


def _eviback_config() -> type:
    from eviback.config import EviBackConfig

    return EviBackConfig


def test_the_defaults_are_today_s_rewards():
    from eviback.config import EviBackConfig

    grpo_cfg = load_config(GRPOConfig, ROOT / "common" / "configs" / "grpo_tiny.yaml")
    assert grpo_cfg.reward.reward_fn() is exact_match and grpo_cfg.reward.estimator() is grpo
    evi = load_config(EviBackConfig, ROOT / "eviback" / "configs" / "tiny.yaml")
    from eviback.backoff import backoff_advantages, teacher_backoff_reward

    assert evi.reward.reward_fn() is teacher_backoff_reward
    assert evi.reward.estimator() is backoff_advantages


def one_grpo_step(world: Path, run_dir: Path, *reward: str) -> tuple[dict, dict]:
    """One step of the search GRPO loop on the tiny world (HF engine, 2 questions x 4) with
    ``reward`` overrides: the loop's result and the step's metrics row."""
    from common.search_grpo import train_grpo
    from common.train import read_metrics

    over = [
        f"assets.world={world}", f"assets.model={world / 'model'}", f"run_dir={run_dir}", "steps=1",
        "questions_per_step=2", "n=4", "eval_every=0", "loss.micro_batch_size=4",
        "engine.backend=hf", *reward,
    ]  # fmt: skip
    out = train_grpo(load_config(GRPOConfig, ROOT / "common/configs/grpo_tiny.yaml", over))
    (row,) = read_metrics(run_dir / "metrics.jsonl")
    return out, row


@pytest.mark.slow
def test_a_user_reward_by_import_path_trains_the_search_grpo_loop(
    tiny_world, tmp_path, user_module
):
    run_dir = tmp_path / "run"
    out, row = one_grpo_step(tiny_world, run_dir, "reward.fn=my_rewards:answered",
                             "reward.advantage=my_rewards:flat_advantages")  # fmt: skip
    samples = json.loads((run_dir / "samples" / "step_00001.json").read_text())
    # the reward is the share of rollouts with an answer, its own metric logged beside it
    assert row["reward"] == pytest.approx(row["valid_answer_rate"])
    assert row["answered_count"] == 8
    assert all(s["reward"] == float(s["answer"] is not None) for s in samples)
    assert out["before"] is None


@pytest.mark.slow
def test_the_parts_train_the_reference_loop_as_its_code_before_them_did(
    tiny_world, tmp_path, user_module
):
    """The default parts (exact_match, grpo) against the functions the loop called before
    them (``em_rewards``, ``group_normalized_advantages``, as a user's parts), on the same
    seed: the same metrics (times aside) and the same samples. The fixture's random model never
    answers, so EM is 0 throughout and this checks the loop around the parts (rollouts, the
    update, the logs); their values on groups with right and wrong answers are compared with the
    old functions above (``test_exact_match_and_f1_by_hand_and_equal_to_the_loop_s_old_reward``)."""
    _, parts = one_grpo_step(tiny_world, tmp_path / "parts")
    _, old = one_grpo_step(tiny_world, tmp_path / "old", "reward.fn=my_rewards:old_em",
                           "reward.advantage=my_rewards:old_grpo")  # fmt: skip
    untimed = [k for k in parts if not k.startswith("time/")]
    assert sorted(untimed) == sorted(k for k in old if not k.startswith("time/"))
    assert {k: parts[k] for k in untimed} == {k: old[k] for k in untimed}
    assert parts["reward"] == 0.0 and "loss" in parts  # the random model: no answer, no signal
    same = [(tmp_path / r / "samples" / "step_00001.json").read_text() for r in ("parts", "old")]
    assert same[0] == same[1]


def test_step_layout_and_spread_to_tokens_by_hand():
    t = Trajectory("g", 0, "q", "q?", ["x"], [1, 2], response_ids=[5] * 9,
                   steps=[Step("search", 0, 3), Step("answer", 6, 8)], answer="x")  # fmt: skip
    layout = step_layout([t])
    assert layout == {"step_kinds": [["search", "answer"]], "step_tokens": [[(0, 3), (6, 8)]],
                      "response_tokens": [9]}  # fmt: skip
    # the observation (3-6) and the token after the answer (8) carry no advantage
    got = spread_to_tokens([[0.5, -1.0]], layout["step_tokens"], layout["response_tokens"])
    assert got == [[0.5, 0.5, 0.5, 0.0, 0.0, 0.0, -1.0, -1.0, 0.0]]
    with pytest.raises(ValueError, match="trajectory 0: 1 values for 2 steps"):
        spread_to_tokens([[0.5]], layout["step_tokens"], layout["response_tokens"])
    assert check_step_scores([[1, 2]], [t], "k='v'") == [[1.0, 2.0]]
    with pytest.raises(ValueError, match=r"k='v' gave 2 score lists for 1 trajectories"):
        check_step_scores([[1, 2], [3]], [t], "k='v'")
    with pytest.raises(ValueError, match=r"k='v', trajectory 0: 2 scores for 2 steps, or one not"):
        check_step_scores([[1.0, float("nan")]], [t], "k='v'")


def test_a_step_estimator_without_a_step_scorer_is_refused_at_config_time(user_module):
    path = ROOT / "common" / "configs" / "grpo_tiny.yaml"
    with pytest.raises(ConfigError, match="needs step scores: set reward.step_scorer"):
        load_config(GRPOConfig, path, ["reward.advantage=arco.advantages:DenseAdvantages"])
    with pytest.raises(ConfigError, match="reward.step_scorer='nope:X' does not import"):
        load_config(GRPOConfig, path, ["reward.step_scorer=nope:X"])
    cfg = load_config(GRPOConfig, path, ["reward.step_scorer=my_rewards:SearchesPay"])
    assert cfg.reward.scorer() is not None and load_config(GRPOConfig, path).reward.scorer() is None


@pytest.mark.slow
def test_arco_s_dense_advantages_from_a_step_scorer_train_the_search_grpo_loop(
    tiny_world, tmp_path, user_module
):
    import my_rewards

    from arco.advantages import dense_advantages

    _, row = one_grpo_step(tiny_world, tmp_path / "run", "reward.step_scorer=my_rewards:SearchesPay",
                           "reward.advantage=my_rewards:Recorded")  # fmt: skip
    assert row["time/step_scorer"] >= 0 and my_rewards.SEEN  # the questions reached the scorer
    ((extras, scores, adv),) = my_rewards.Recorded.CALLS
    assert len(scores) == len(adv) == 8 and extras["response_tokens"] == [len(a) for a in adv]
    assert any(e > s for steps in extras["step_tokens"] for s, e in steps)  # steps were sampled
    per_step = dense_advantages(scores, extras["step_kinds"])  # c 0.5, the invalid bucket
    for a, steps, values in zip(adv, extras["step_tokens"], per_step, strict=True):
        inside = {i for s, e in steps for i in range(s, e)}
        assert all(a[i] == 0.0 for i in range(len(a)) if i not in inside)
        for (s, e), v in zip(steps, values, strict=True):
            assert a[s:e] == [v] * (e - s)


def test_a_step_scorer_class_takes_its_keyword_arguments_from_the_config(user_module):
    from arco.config import ArcoConfig
    from experiments.step_scorers import TeacherEvidenceSteps

    spec = "reward.step_scorer=experiments.step_scorers:TeacherEvidenceSteps"
    cfg = load_config(GRPOConfig, None, [spec, "reward.step_scorer_args={beta: 0.3, top_m: 2}"])
    got = cfg.reward.scorer()
    assert isinstance(got, TeacherEvidenceSteps) and (got.beta, got.top_m) == (0.3, 2)
    arco = load_config(
        ArcoConfig, ROOT / "arco/configs/tiny.yaml", [spec, "reward.step_scorer_args.beta=0.5"]
    )  # one key in both: ARCO's reward section takes it
    assert arco.reward.scorer().beta == 0.5
    bad = [
        ([spec, "reward.step_scorer_args.btea=1"], r"reward.step_scorer='experiments.step_scorers:"
         r"TeacherEvidenceSteps' does not take the arguments \['btea'\].*\(it takes \(beta"),
        (["reward.step_scorer_args.beta=1"], "reward.step_scorer_args is set but "
         "reward.step_scorer is empty"),
        (["reward.step_scorer=my_rewards:two_args", "reward.step_scorer_args.x=1"],
         r"'my_rewards:two_args' is not a class, so it takes no arguments \(given \['x'\]\)"),
    ]  # fmt: skip
    for over, message in bad:
        with pytest.raises(ConfigError, match=message) as e:
            load_config(GRPOConfig, None, over)
        assert "\n" not in str(e.value)
    with pytest.raises(
        ConfigError, match="reward.step_scorer_args is set but reward.step_scorer is rubric"
    ):
        load_config(ArcoConfig, ROOT / "arco/configs/tiny.yaml", ["reward.step_scorer_args.beta=1"])
    # the constructor's own check, as one line naming the key
    with pytest.raises(ValueError, match=r"^reward.step_scorer='my_rewards:Picky': picky says no$"):
        load_part("my_rewards:Picky", "reward.step_scorer", "step scorer", {}, {"level": -1})
