"""The run loop's fields are declared once (``common.rl_loop.RunLoopConfig``) and taken as they
are by the reference GRPO run and EviBack: same defaults, ranges and help, no redeclaration."""

from __future__ import annotations

import dataclasses

import pytest

from common.config import ConfigError, load_config
from common.rl_loop import RunLoopConfig
from common.search_grpo import GRPOConfig
from eviback.config import EviBackConfig

RUN_LOOP = (
    "seed",
    "steps",
    "questions_per_step",
    "n",
    "eval_every",
    "eval_questions",
    "save_every",
    "keep_checkpoints",
    "allow_config_change",
)


def test_run_loop_config_holds_the_run_loop_fields():
    assert tuple(f.name for f in dataclasses.fields(RunLoopConfig)) == RUN_LOOP


@pytest.mark.parametrize("cls", [GRPOConfig, EviBackConfig])
def test_the_fields_are_inherited_not_redeclared(cls):
    assert issubclass(cls, RunLoopConfig)
    own = {f.name: f for f in dataclasses.fields(cls)}
    for f in dataclasses.fields(RunLoopConfig):
        assert own[f.name] is f, f"{cls.__name__} redeclares {f.name}"
        assert f.name not in cls.__dict__.get("__annotations__", {}), f.name


@pytest.mark.parametrize("cls", [GRPOConfig, EviBackConfig])
def test_a_bad_run_loop_value_is_one_line_naming_the_key(cls):
    with pytest.raises(ConfigError) as err:
        load_config(cls, None, ["n=0"])
    assert str(err.value) == (
        "config key 'n' (from the command line): 0 is out of range; allowed: >= 1"
    )
