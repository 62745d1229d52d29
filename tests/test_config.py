from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from common.config import ConfigError, config_to_dict, describe_config, dump_config, load_config


@dataclass
class TrainCfg:
    lr: float = field(default=1e-5, metadata={"help": "learning rate"})
    steps: int = field(default=100, metadata={"help": "optimizer steps"})
    warmup: float = 0.0


@dataclass
class RolloutCfg:
    max_turns: int = field(default=4, metadata={"help": "agent turns per question"})
    temperature: float = 1.0
    engine: Literal["vllm", "hf"] = field(default="vllm", metadata={"help": "generation engine"})
    stop: list[str] = field(default_factory=lambda: ["</search>"])


@dataclass
class RunCfg:
    name: str = field(metadata={"help": "run name"})
    seed: int = 0
    bf16: bool = False
    train: TrainCfg = field(default_factory=TrainCfg)
    rollout: RolloutCfg = field(default_factory=lambda: RolloutCfg(max_turns=8))
    eval_every: int | None = None
    weights: dict[str, float] = field(default_factory=dict)


@dataclass
class Checked:
    k: int = 1

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_file_and_overrides_fill_nested_fields(tmp_path: Path) -> None:
    path = write(
        tmp_path / "run.yaml",
        "name: demo\ntrain:\n  lr: 3.0e-6\nrollout:\n  engine: hf\nweights: {em: 1, f1: 0.5}\n",
    )
    cfg = load_config(RunCfg, path, ["train.lr=1e-6", "rollout.max_turns=2", "eval_every=10"])
    assert cfg.name == "demo"
    assert cfg.train == TrainCfg(lr=1e-6, steps=100, warmup=0.0)
    assert isinstance(cfg.train.lr, float)  # YAML 1.1 reads 1e-6 as a string
    # a partial section lays over the field's default instance (max_turns=8), not the class default
    assert cfg.rollout == RolloutCfg(max_turns=2, temperature=1.0, engine="hf")
    assert cfg.eval_every == 10
    assert cfg.weights == {"em": 1.0, "f1": 0.5}
    assert isinstance(cfg.weights["em"], float)


def test_defaults_without_file_and_section_default_kept() -> None:
    cfg = load_config(RunCfg, overrides=["name=x", "train.warmup=3"])
    assert cfg.rollout.max_turns == 8
    assert cfg.train.warmup == 3.0 and isinstance(cfg.train.warmup, float)
    assert load_config(RunCfg, overrides=["name=x", "eval_every=null"]).eval_every is None


def test_defaults_file_inherits_and_child_wins(tmp_path: Path) -> None:
    (tmp_path / "base").mkdir()
    write(tmp_path / "base" / "root.yaml", "name: root\nseed: 1\ntrain: {lr: 0.1, steps: 7}\n")
    write(tmp_path / "base" / "mid.yaml", "defaults: root.yaml\nseed: 2\n")
    child = write(tmp_path / "child.yaml", "defaults: base/mid.yaml\ntrain: {lr: 0.2}\n")
    cfg = load_config(RunCfg, child)
    assert (cfg.name, cfg.seed, cfg.train.lr, cfg.train.steps) == ("root", 2, 0.2, 7)


def test_defaults_loop_is_an_error(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", "defaults: b.yaml\n")
    write(tmp_path / "b.yaml", "defaults: a.yaml\n")
    with pytest.raises(ConfigError, match="loops"):
        load_config(RunCfg, tmp_path / "a.yaml")


def test_unknown_key_names_key_file_and_closest(tmp_path: Path) -> None:
    path = write(tmp_path / "run.yaml", "name: x\ntrain:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError) as e:
        load_config(RunCfg, path)
    assert "'train.lrr'" in str(e.value)
    assert str(path) in str(e.value)
    assert "did you mean 'train.lr'" in str(e.value)


def test_unknown_override_names_command_line() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(RunCfg, overrides=["name=x", "rollout.max_turn=3"])
    msg = str(e.value)
    assert "'rollout.max_turn'" in msg and "command line" in msg
    assert "did you mean 'rollout.max_turns'" in msg


def test_unknown_key_in_wrong_section_suggests_the_right_one() -> None:
    with pytest.raises(ConfigError, match=r"unknown config key 'lr' .*did you mean 'train.lr'"):
        load_config(RunCfg, overrides=["name=x", "lr=3"])


def test_unknown_key_in_inherited_file_names_that_file(tmp_path: Path) -> None:
    write(tmp_path / "base.yaml", "name: x\nsede: 3\n")
    child = write(tmp_path / "child.yaml", "defaults: base.yaml\nseed: 1\n")
    with pytest.raises(ConfigError, match=r"'sede'.*base\.yaml.*did you mean 'seed'"):
        load_config(RunCfg, child)


@pytest.mark.parametrize(
    ("override", "expected", "shown"),
    [
        ("train.steps=1.5", "int", "1.5"),
        ("train.lr=fast", "float", "'fast'"),
        ("bf16=1", "bool", "1"),
        ("train.steps=true", "int", "True"),
        ("rollout.engine=sglang", "Literal['vllm', 'hf']", "'sglang'"),
        ("rollout.stop=</s>", "list[str]", "'</s>'"),
        ("rollout.stop=[1]", "str", "1"),
        ("eval_every=soon", "int | None", "'soon'"),
        ("train=3", "TrainCfg", "3"),
    ],
)
def test_wrong_type_names_key_type_and_value(override: str, expected: str, shown: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(RunCfg, overrides=["name=x", override])
    msg = str(e.value)
    key = override.split("=")[0]
    assert f"'{key}" in msg and "command line" in msg
    assert f"expected {expected}" in msg and f"got {shown}" in msg


def test_missing_required_field_is_named() -> None:
    with pytest.raises(ConfigError, match="'name' is required"):
        load_config(RunCfg)


def test_post_init_check_becomes_config_error() -> None:
    with pytest.raises(ConfigError, match="k must be >= 1"):
        load_config(Checked, overrides=["k=0"])


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("- a\n- b\n", "must hold a mapping"),
        ("a: [1\n", "not valid YAML"),
        ("defaults: 3\n", "file name"),
    ],
)
def test_bad_files(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(RunCfg, write(tmp_path / "bad.yaml", text))


def test_missing_file_and_malformed_override(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(RunCfg, tmp_path / "none.yaml")
    with pytest.raises(ConfigError, match="key.sub=value"):
        load_config(RunCfg, overrides=["name"])


def test_dump_and_load_round_trip(tmp_path: Path) -> None:
    cfg = load_config(
        RunCfg, overrides=["name=rt", "train.lr=1e-7", "weights={a: 2.5}", "bf16=true"]
    )
    dump_config(cfg, tmp_path / "out" / "config.yaml")
    assert load_config(RunCfg, tmp_path / "out" / "config.yaml") == cfg
    assert config_to_dict(cfg)["rollout"]["stop"] == ["</search>"]
    assert yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())["train"]["lr"] == 1e-7


@given(
    lr=st.floats(min_value=1e-12, max_value=1e3),
    steps=st.integers(min_value=-(2**40), max_value=2**40),
    name=st.text(min_size=1, max_size=20),
    stop=st.lists(st.text(max_size=10), max_size=3),
)
def test_round_trip_property(
    tmp_path_factory: pytest.TempPathFactory, lr: float, steps: int, name: str, stop: list[str]
) -> None:
    cfg = RunCfg(name=name, train=TrainCfg(lr=lr, steps=steps), rollout=RolloutCfg(stop=stop))
    path = tmp_path_factory.getbasetemp() / "round_trip.yaml"
    dump_config(cfg, path)
    assert load_config(RunCfg, path) == cfg


def test_describe_lists_dotted_keys_types_defaults_help() -> None:
    lines = describe_config(RunCfg).splitlines()
    rows = {line.split()[0]: line for line in lines}
    assert list(rows) == [
        "name",
        "seed",
        "bf16",
        "train.lr",
        "train.steps",
        "train.warmup",
        "rollout.max_turns",
        "rollout.temperature",
        "rollout.engine",
        "rollout.stop",
        "eval_every",
        "weights",
    ]
    assert rows["name"].split()[1:3] == ["str", "required"]
    assert rows["train.lr"].split() == ["train.lr", "float", "1e-05", "learning", "rate"]
    assert rows["rollout.max_turns"].split()[1:3] == ["int", "8"]  # the field's own default
    assert "Literal['vllm', 'hf']" in rows["rollout.engine"]


@dataclass
class _WithTuple:
    betas: tuple[float, float] = (0.9, 0.999)
    sizes: tuple[int, ...] = (1, 2)


def test_tuple_fields_load_override_and_round_trip(tmp_path):
    cfg = load_config(_WithTuple, None, ["betas=[0.8, 0.95]", "sizes=[3, 4, 5]"])
    assert cfg.betas == (0.8, 0.95) and cfg.sizes == (3, 4, 5)
    dump_config(cfg, tmp_path / "c.yaml")
    assert load_config(_WithTuple, tmp_path / "c.yaml") == cfg
    with pytest.raises(ConfigError, match="betas"):
        load_config(_WithTuple, None, ["betas=[0.8]"])


@dataclass
class _WithFiles:
    files: dict[str, str] = field(default_factory=lambda: {"tiny": "t.jsonl"})


def test_mapping_override_replaces_and_dotted_entry_override_merges(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("files: {tiny: t.jsonl}\n")
    replaced = load_config(_WithFiles, path, ["files={nq: nq.jsonl}"]).files
    assert replaced == {"nq": "nq.jsonl"}
    merged = load_config(_WithFiles, path, ["files.nq=nq.jsonl"]).files
    assert merged == {"tiny": "t.jsonl", "nq": "nq.jsonl"}
