"""The reward sections share their keys: CER's extends ``common.rewards.RewardConfig``; the step
scorer (``reward.step_scorer``, ``reward.step_scorer_args``) is declared once,
``common.rewards.StepScorerConfig``, with each method's own default."""

from __future__ import annotations

import dataclasses

import pytest

from cer.config import BUILTIN_REWARDS, CERConfig
from cer.config import RewardConfig as CERRewardConfig
from common.config import ConfigError, load_config
from common.grpo_config import GRPORewardConfig
from common.rewards import RewardConfig, StepScorerConfig


def test_cer_s_reward_section_is_the_shared_one_with_its_own_defaults():
    assert issubclass(CERRewardConfig, RewardConfig)
    r = CERRewardConfig()
    assert (r.type, r.fn, r.advantage, r.fn_args) == ("cer", "", "rloo", {})
    assert r.REWARDS is BUILTIN_REWARDS
    assert r.reward_name() == "cer"  # an empty fn is the type's reward
    assert CERRewardConfig(type="rule", fn="f1").reward_name() == "f1"
    assert CERRewardConfig(type="rule").reward_fn() is CERRewardConfig(fn="rule").reward_fn()
    fields = {f.name for f in dataclasses.fields(CERRewardConfig)}
    assert {f.name for f in dataclasses.fields(RewardConfig)} <= fields


def test_cer_s_reward_keys_keep_their_checks():
    cfg = load_config(CERConfig, None, ["reward.fn=exact_match", "reward.advantage=grpo"])
    assert (cfg.reward.reward_name(), cfg.reward.advantage) == ("exact_match", "grpo")
    with pytest.raises(ConfigError, match=r"reward.fn='nope:x' does not import"):
        load_config(CERConfig, None, ["reward.fn=nope:x"])
    with pytest.raises(ConfigError, match="choices: 'rloo', 'grpo'"):
        load_config(CERConfig, None, ["reward.advantage=backoff"])


def test_cer_s_help_names_the_typed_reward_context():
    helps = {f.name: f.metadata["help"] for f in dataclasses.fields(CERRewardConfig)}
    assert "ctx.scoring" in helps["fn"] and "CERScoring" in helps["fn"]
    assert "ctx.extra" not in helps["fn"]


def test_one_step_scorer_declaration_each_method_its_default():
    from arco.config import ArcoRewardConfig

    assert issubclass(GRPORewardConfig, StepScorerConfig)
    assert issubclass(ArcoRewardConfig, StepScorerConfig)
    grpo, arco = GRPORewardConfig(), ArcoRewardConfig()
    assert (grpo.step_scorer, grpo.external, grpo.scorer()) == ("", False, None)
    assert (arco.step_scorer, arco.external, arco.scorer()) == ("rubric", False, None)
    shared = StepScorerConfig.__dataclass_fields__
    for cls in (GRPORewardConfig, ArcoRewardConfig):  # declared once, in StepScorerConfig
        assert cls.__dataclass_fields__["step_scorer_args"] is shared["step_scorer_args"]
    assert GRPORewardConfig.__dataclass_fields__["step_scorer"] is shared["step_scorer"]
    empty = "^reward.step_scorer_args is set but reward.step_scorer is empty$"
    with pytest.raises(ValueError, match=empty):
        GRPORewardConfig(step_scorer_args={"beta": 1})
    with pytest.raises(ValueError, match=r"is rubric \(μ's own\)$"):
        ArcoRewardConfig(step_scorer_args={"beta": 1})
