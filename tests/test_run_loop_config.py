"""The run loop's fields and the shared data keys are declared once (``common.run_config``) and
taken by all four run configs (the reference GRPO loop, ARCO, CER, EviBack): a method redeclares a
field only to change its default (same type and range); old key names fail naming the new one."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from arco.config import ArcoConfig
from cer.config import CERConfig
from common.config import ConfigError, load_config, renamed_keys
from common.rl_loop import EngineConfig, LossConfig, RunLoopConfig
from common.run_config import AssetsConfig, SearchRunConfig
from common.search_grpo import GRPOConfig
from eviback.config import EviBackConfig

RUN_LOOP = (
    "run_dir",
    "resume",
    "allow_config_change",
    "seed",
    "steps",
    "eval_every",
    "eval_questions",
    "save_every",
    "keep_checkpoints",
    "samples_per_step",
    "max_nonfinite_in_a_row",
    "max_identical_groups_in_a_row",
    "logprob_gap_limit",
    "max_logprob_gap_in_a_row",
    "min_sleep_freed_share",
    "engine",
    "train",
    "log",
)
ALL = [GRPOConfig, ArcoConfig, CERConfig, EviBackConfig]
BOUNDS = ("ge", "gt", "le", "lt")


def test_run_loop_config_holds_the_run_loop_fields():
    assert tuple(f.name for f in dataclasses.fields(RunLoopConfig)) == RUN_LOOP
    assert [f.name for f in dataclasses.fields(SearchRunConfig)][len(RUN_LOOP) :] == [
        "questions_per_step",
        "n",
        "agent",
        "loss",
    ]


def test_rl_loop_still_exports_the_moved_classes():
    import common.run_config as rc

    assert (EngineConfig, LossConfig, RunLoopConfig) == (
        rc.EngineConfig,
        rc.LossConfig,
        rc.RunLoopConfig,
    )


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_the_fields_are_inherited_or_only_their_default_changes(cls):
    assert issubclass(cls, RunLoopConfig)
    own = {f.name: f for f in dataclasses.fields(cls)}
    hints, base_hints = typing.get_type_hints(cls), typing.get_type_hints(RunLoopConfig)
    for f in dataclasses.fields(RunLoopConfig):
        mine = own[f.name]
        if mine is f:
            continue  # inherited as it is
        assert hints[f.name] == base_hints[f.name], f"{cls.__name__}.{f.name}: another type"
        assert {k: mine.metadata.get(k) for k in BOUNDS} == {
            k: f.metadata.get(k) for k in BOUNDS
        }, f"{cls.__name__}.{f.name}: another range"


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_every_assets_section_extends_the_shared_one(cls):
    assets = typing.get_type_hints(cls)["assets"]
    assert issubclass(assets, AssetsConfig)
    names = {f.name for f in dataclasses.fields(assets)}
    assert {"model", "train", "dev"} <= names
    assert not names & {"train_file", "dev_file", "train_files", "dev_files", "eval_files"}


@pytest.mark.parametrize("cls", [GRPOConfig, EviBackConfig])
def test_a_bad_run_loop_value_is_one_line_naming_the_key(cls):
    with pytest.raises(ConfigError) as err:
        load_config(cls, None, ["n=0"])
    assert str(err.value) == (
        "config key 'n' (from the command line): 0 is out of range; allowed: >= 1"
    )


CASES = [(cls, old, new) for cls in ALL for old, new in renamed_keys(cls).items()]


@pytest.mark.parametrize(("cls", "old", "new"), CASES, ids=lambda x: getattr(x, "__name__", x))
def test_an_old_key_on_the_command_line_names_the_new_one(cls, old, new):
    assert new.split(".")[0] in {f.name for f in dataclasses.fields(cls)}  # the new key exists
    value = "{a: x.jsonl}" if old.endswith(("_files", "benchmarks")) else "x"
    with pytest.raises(ConfigError) as err:
        load_config(cls, None, [f"{old}={value}"])
    assert str(err.value) == (
        f"config key {old!r} (from the command line) was renamed: use {new!r} "
        "(docs/configuration.md)"
    )


def test_an_old_key_in_a_file_names_the_file_and_the_new_key(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("assets:\n  train_files: {nq: nq.jsonl}\n")
    with pytest.raises(ConfigError) as err:
        load_config(EviBackConfig, path)
    assert str(err.value) == (
        f"config key 'assets.train_files' (from file {path}) was renamed: use 'assets.train' "
        "(docs/configuration.md)"
    )


def test_eviback_train_takes_one_file_or_a_named_mix():
    one = load_config(EviBackConfig, None, ["assets.train=data/nq.jsonl"]).assets
    assert one.files("train") == {"train": "data/nq.jsonl"}
    mix = load_config(EviBackConfig, None, ["assets.train={nq: a.jsonl, hotpotqa: b.jsonl}"])
    assert mix.assets.files("train") == {"nq": "a.jsonl", "hotpotqa": "b.jsonl"}
    assert load_config(EviBackConfig).assets.files("dev") == {}


def test_cer_advantage_sits_under_reward():
    assert load_config(CERConfig, None, ["reward.advantage=grpo"]).reward.advantage == "grpo"
