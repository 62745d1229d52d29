"""CER's reward family as parts (common.rewards): each type through ``GroupReward`` equals
``group_rewards``'s (the trainer's call before), on fixed groups; ``reward.fn`` in CER's config."""

from __future__ import annotations

import pytest
import torch

from cer.config import CERConfig
from cer.data import MathExample
from cer.rewards.answer import solution_split
from cer.rewards.groups import (
    CER,
    EXACT,
    RULE,
    RULE_CER,
    VERIFREE,
    CERScoring,
    Group,
    GroupReward,
    common_groups,
    group_rewards,
)
from cer.rewards.scoring import hf_prefix_scorer
from cer.trainer import SIGNAL_TYPES
from common.config import ConfigError, load_config
from common.rewards import RewardContext, exact_match, f1
from common.rollout.trajectory import Trajectory


def make_group(tok, problem: str, gold: str, responses: list[str], forms=None) -> Group:
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    prompt = tok.encode(problem, add_special_tokens=False)
    ids = [tok.encode(r, add_special_tokens=False) + [eos] for r in responses]
    meta = {"answer_forms": forms, "verifier": "alias"} if forms else {}
    splits = [solution_split(i, tok) for i in ids]
    trajs = [Trajectory(problem, k, problem, problem, [gold], prompt) for k in range(len(ids))]
    return Group(MathExample(problem, problem, gold, meta), prompt, trajs, splits)


@pytest.fixture(scope="module")
def groups(char_tokenizer):
    return [
        make_group(char_tokenizer, "Half of 1?", "\\frac{1}{2}",
                   ["so \\boxed{0.5}", "hence \\boxed{1/2}", "so \\boxed{\\frac{1}{2}}", "7"]),
        make_group(char_tokenizer, "5 + 7?", "12", ["5 + 7 = \\boxed{12}", "\\boxed{1}"],
                   forms=["12", "twelve"]),
    ]  # fmt: skip


def test_common_groups_carry_the_reference_its_aliases_and_the_boxed_answers(groups):
    g0, g1 = common_groups(groups)
    assert g0.golden_answers == ["\\frac{1}{2}"] and g0.aliases == []
    assert g0.predictions == ["0.5", "1/2", "\\frac{1}{2}", None]
    assert g1.aliases == ["twelve"] and g1.source is groups[1]
    assert g1.trajectories is groups[1].trajs


@pytest.mark.parametrize("signal", [False, True])
def test_every_type_through_the_parts_equals_group_rewards(
    groups, char_tokenizer, tiny_qwen3, signal
):
    scorer = hf_prefix_scorer(tiny_qwen3)
    types = SIGNAL_TYPES if signal else ()
    ctx = RewardContext(tokenizer=char_tokenizer, scoring=CERScoring(scorer, types=types))
    for reward in (EXACT, RULE, CER, RULE_CER, VERIFREE):
        old, old_stats = group_rewards(
            types or [reward.type], groups, scorer, char_tokenizer, None, "first"
        )
        new = reward(common_groups(groups), ctx)
        assert torch.equal(new.values, old[reward.type])
        assert new.metrics == old_stats
        assert new.extras["by_type"].keys() == old.keys()
        for k in old:  # ref_prob is NaN where a solution is not scored
            torch.testing.assert_close(new.extras["by_type"][k], old[k], rtol=0, atol=0,
                                       equal_nan=True)  # fmt: skip
    # by hand: the reference's string once in group 0, "12" once in group 1; the rule also
    # takes 0.5 and 1/2
    assert EXACT(common_groups(groups), ctx).values.tolist() == [0, 0, 1, 0, 1, 0]
    assert RULE(common_groups(groups), ctx).values.tolist() == [1, 1, 1, 0, 1, 0]


def test_common_rewards_score_cer_groups_by_their_boxed_answers(groups):
    # SQuAD-normalised EM against the reference and its aliases: punctuation goes, so
    # \frac{1}{2} matches itself ("frac12") but 1/2 ("12") does not
    assert exact_match(common_groups(groups), RewardContext()).values.tolist() == [
        0, 0, 1, 0, 1, 0
    ]  # fmt: skip
    assert f1(common_groups(groups), RewardContext()).values[4].item() == 1.0


def test_reward_fn_defaults_to_the_type_and_is_checked_when_built():
    cfg = load_config(CERConfig, "cer/configs/tiny.yaml")
    assert cfg.reward.fn == "" and cfg.reward.reward_fn() is CER
    for name, want in (("rule+cer", RULE_CER), ("f1", f1), ("exact_match", exact_match)):
        assert load_config(CERConfig, None, [f"reward.fn={name}"]).reward.reward_fn() is want
    cfg = load_config(CERConfig, None, ["reward.type=verifree"])
    assert isinstance(cfg.reward.reward_fn(), GroupReward) and cfg.reward.reward_fn() is VERIFREE
    with pytest.raises(ConfigError, match=r"reward.fn='cer.rewards.groups:common_groups' has the "
                       r"wrong signature: a reward is called as \(groups, ctx\)"):  # fmt: skip
        load_config(CERConfig, None, ["reward.fn=cer.rewards.groups:common_groups"])
    with pytest.raises(ConfigError, match="reward.fn='rule_cer' is neither a built-in"):
        load_config(CERConfig, None, ["reward.fn=rule_cer"])


@pytest.mark.slow
def test_another_reward_trains_cer_and_every_type_is_still_logged(tmp_path):
    """reward.fn=f1 (common's, not a CER type): it trains, and the types logged beside it
    (reward.signal) come from their own group_rewards pass."""
    import json

    from cer.tasks.build import build_tiny
    from cer.trainer import ALL_TYPES, train_cer
    from common.metrics import f1_score
    from common.train import read_metrics

    task = build_tiny(tmp_path / "task", seed=0, n_train=16, n_dev=2, n_test=2)
    rows = {json.loads(x)["id"]: json.loads(x) for x in (task / "train.jsonl").open()}
    run_dir = tmp_path / "run"
    over = [f"assets.model={task / 'model'}", f"assets.train={task / 'train.jsonl'}",
            f"assets.dev={task / 'dev.jsonl'}", f"run_dir={run_dir}", "steps=1",
            "prompts_per_step=1", "group_size=4", "loss.micro_batch_size=4", "eval_every=0",
            "max_response_tokens=16", "reward.fn=f1"]  # fmt: skip
    train_cer(load_config(CERConfig, "cer/configs/tiny.yaml", over))
    (row,) = read_metrics(run_dir / "metrics.jsonl")
    (group,) = json.loads((run_dir / "samples" / "step_00001.json").read_text())["groups"]
    forms = rows[group["id"].split(":")[-1]]["answer_forms"]
    want = [f1_score(s["answer"], forms) for s in group["samples"]]
    assert row["reward"] == pytest.approx(sum(want) / 4)
    assert all(f"reward/{t}" in row and f"signal/abs_adv/{t}" in row for t in ALL_TYPES)
    assert "reward/f1" not in row and "cer/ref_prob_mean" in row
