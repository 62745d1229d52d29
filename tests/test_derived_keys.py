"""Keys a trainer derives itself (``DERIVED`` of each run config class) are not settings: a config
file or an override that sets one is refused with one line naming the key, where it was set and
what to set instead; every other key still loads, and a run's recorded settings still load."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from arco.config import ArcoConfig
from cer.config import CERConfig
from common.config import ConfigError, derived_keys, describe_config, dump_config, load_config
from common.search_grpo import GRPOConfig
from common.warmup import WarmupConfig
from eviback.config import EviBackConfig

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    GRPOConfig: "common/configs/grpo_tiny.yaml",
    WarmupConfig: "common/configs/warmup_tiny.yaml",
    EviBackConfig: "eviback/configs/tiny.yaml",
    CERConfig: "cer/configs/tiny.yaml",
    ArcoConfig: "arco/configs/tiny.yaml",
}
# what each trainer assigns before its TrainEngine is built (read off the trainers)
EXPECTED = {
    GRPOConfig: {"train.grad_accum", "train.seed"},
    WarmupConfig: {"train.total_steps", "train.seed"},
    EviBackConfig: {"train.grad_accum", "train.total_steps", "train.seed"},
    CERConfig: {
        "train.grad_accum",
        "train.total_steps",
        "train.seed",
        "warmup.train.total_steps",
        "warmup.train.seed",
    },
    ArcoConfig: {"train.lr", "train.grad_accum", "train.total_steps", "train.seed", "steps"},
}
INSTEAD = {  # the keys each refusal names for the user to set instead
    (GRPOConfig, "train.seed"): "set seed instead",
    (GRPOConfig, "train.grad_accum"): "set questions_per_step, n, loss.micro_batch_size instead",
    (WarmupConfig, "train.total_steps"): "set steps instead",
    (EviBackConfig, "train.total_steps"): "set steps instead",
    (CERConfig, "train.grad_accum"): "set prompts_per_step, group_size, loss.micro_batch_size",
    (CERConfig, "warmup.train.total_steps"): "set warmup.steps instead",
    (ArcoConfig, "train.lr"): "set rl.pi_lr_sparse, rl.mu_lr, rl.head_lr, warmup.pi_lr, "
    "warmup.mu_lr, warmup.head_lr instead",
    (ArcoConfig, "train.total_steps"): "set rl.sparse_steps, rl.dense_steps instead",
    (ArcoConfig, "steps"): "set rl.sparse_steps, rl.dense_steps instead",
}
CASES = [(cls, key) for cls, keys in EXPECTED.items() for key in sorted(keys)]


def _value(key: str) -> str:
    return "1.0e-5" if key.endswith(".lr") else "3"


def test_each_class_declares_what_its_trainer_derives():
    assert {cls: set(derived_keys(cls)) for cls in CONFIGS} == EXPECTED


@pytest.mark.parametrize(("cls", "key"), CASES, ids=lambda x: getattr(x, "__name__", x))
def test_a_derived_key_on_the_command_line_is_refused(cls, key):
    with pytest.raises(ConfigError) as err:
        load_config(cls, ROOT / CONFIGS[cls], [f"{key}={_value(key)}"])
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith(f"config key '{key}' (from the command line) is derived by the trainer")
    assert INSTEAD.get((cls, key), "instead") in line


@pytest.mark.parametrize(("cls", "key"), CASES, ids=lambda x: getattr(x, "__name__", x))
def test_a_derived_key_in_a_config_file_is_refused(cls, key, tmp_path):
    *section, name = key.split(".")
    body = f"{name}: {_value(key)}"
    for part in reversed(section):
        body = f"{part}:\n" + textwrap.indent(body, "  ")
    path = tmp_path / "mine.yaml"
    path.write_text(f"defaults: {ROOT / CONFIGS[cls]}\n{body}\n")
    with pytest.raises(ConfigError) as err:
        load_config(cls, path)
    assert str(err.value).startswith(
        f"config key '{key}' (from file {path}) is derived by the trainer"
    )


@pytest.mark.parametrize("cls", list(CONFIGS), ids=lambda c: c.__name__)
def test_keys_the_trainer_does_not_derive_still_load(cls):
    cfg = load_config(cls, ROOT / CONFIGS[cls], ["train.weight_decay=0.25", "train.warmup_steps=7"])
    assert (cfg.train.weight_decay, cfg.train.warmup_steps) == (0.25, 7)
    if cls is GRPOConfig:  # the GRPO loop's schedule ends at the train.total_steps it is given
        assert load_config(cls, None, ["train.total_steps=33"]).train.total_steps == 33
    if cls is CERConfig:
        assert load_config(cls, None, ["warmup.train.lr=0.01"]).warmup.train.lr == 0.01


@pytest.mark.parametrize("cls", list(CONFIGS), ids=lambda c: c.__name__)
def test_a_runs_recorded_settings_load_with_the_values_the_trainer_derived(cls, tmp_path):
    """A run folder's config.yaml holds the derived values (the trainer set them before the
    folder recorded the settings): it loads as it is, but a derived key set over it is refused."""
    cfg = load_config(cls, ROOT / CONFIGS[cls])
    cfg.train.seed, cfg.train.grad_accum, cfg.train.total_steps = 5, 4, 17
    dump_config(cfg, tmp_path / "config.yaml")
    again = load_config(cls, tmp_path / "config.yaml")
    assert again == cfg and (again.train.seed, again.train.grad_accum) == (5, 4)
    with pytest.raises(ConfigError, match="'train.seed' \\(from the command line\\) is derived"):
        load_config(cls, tmp_path / "config.yaml", ["train.seed=6"])
    # a file over the record that sets a derived key is not a record itself
    (tmp_path / "mine.yaml").write_text("defaults: config.yaml\ntrain:\n  seed: 6\n")
    with pytest.raises(ConfigError, match="'train.seed' \\(from file .*mine.yaml\\) is derived"):
        load_config(cls, tmp_path / "mine.yaml")


def test_help_shows_a_derived_key_as_the_trainers():
    rows = {line.split()[0]: line for line in describe_config(ArcoConfig).splitlines()}
    assert rows["train.seed"].endswith("set by the trainer: train.seed = seed")
    assert rows["train.weight_decay"].endswith("AdamW decoupled weight decay")
