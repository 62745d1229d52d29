"""Settings are checked when the config is built: ranges, choices and cross-field checks of every
config dataclass, with one-line errors naming the key, the value, the range and the source."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from arco.config import ArcoConfig
from cer.config import CERConfig
from common.config import ConfigError, _in_range, describe_config, load_config, range_text
from common.run import schedule
from common.search_grpo import GRPOConfig
from common.warmup import WarmupConfig
from eviback.config import EviBackConfig

ROOT = Path(__file__).resolve().parents[1]
ROOTS = (GRPOConfig, WarmupConfig, CERConfig, EviBackConfig, ArcoConfig)
# number fields that may take any value, with the reason; keep this list short
UNBOUNDED: dict[str, str] = {}


@dataclass
class Ranged:
    k: int = field(default=1, metadata={"help": "at least one", "ge": 1})
    every: int = field(default=0, metadata={"help": "0: never", "ge": 0})
    p: float = field(default=0.5, metadata={"help": "a probability", "ge": 0, "le": 1})
    lr: float = field(default=0.1, metadata={"help": "positive", "gt": 0})
    frac: float = field(default=0.5, metadata={"help": "open interval", "gt": 0, "lt": 1})
    m: int | None = field(default=None, metadata={"help": "optional", "ge": 1})
    betas: tuple[float, float] = field(default=(0.9, 0.99), metadata={"help": "", "lt": 1})
    quotas: dict[str, int] = field(default_factory=dict, metadata={"help": "", "ge": 1})


@dataclass
class Outer:
    inner: Ranged = field(default_factory=Ranged)
    mode: typing.Literal["a", "b"] = field(default="a", metadata={"help": "a | b"})


@pytest.mark.parametrize(
    ("override", "key", "allowed"),
    [
        ("inner.k=0", "inner.k", ">= 1"),
        ("inner.every=-1", "inner.every", ">= 0"),
        ("inner.p=1.01", "inner.p", "[0, 1]"),
        ("inner.p=-0.0001", "inner.p", "[0, 1]"),
        ("inner.lr=0", "inner.lr", "> 0"),
        ("inner.frac=1", "inner.frac", "(0, 1)"),
        ("inner.frac=0", "inner.frac", "(0, 1)"),
        ("inner.p=.nan", "inner.p", "[0, 1]"),
        ("inner.m=0", "inner.m", ">= 1"),
        ("inner.betas=[0.9, 1.0]", "inner.betas[1]", "< 1"),
        ("inner.quotas={nq: 0}", "inner.quotas.nq", ">= 1"),
    ],
)
def test_out_of_range_names_key_value_range_and_source(override, key, allowed) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(Outer, overrides=[override])
    msg = str(e.value)
    assert msg.startswith(f"config key {key!r} (from the command line): ")
    assert msg.endswith(f"is out of range; allowed: {allowed}") and "\n" not in msg


def test_bounds_themselves_are_allowed() -> None:
    over = ["inner.k=1", "inner.every=0", "inner.p=0", "inner.m=null", "inner.betas=[0, 0.5]"]
    cfg = load_config(Outer, overrides=over)
    assert (cfg.inner.k, cfg.inner.every, cfg.inner.p, cfg.inner.m) == (1, 0, 0.0, None)
    assert load_config(Outer, overrides=["inner.p=1", "inner.m=1"]).inner.p == 1.0


def test_out_of_range_in_a_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("inner:\n  k: -3\n")
    with pytest.raises(ConfigError, match=rf"'inner.k' \(from file {path}\): -3 is out of range"):
        load_config(Outer, path)


def test_a_typo_on_the_command_line_is_reported_as_from_the_command_line(tmp_path) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(GRPOConfig, ROOT / "common/configs/grpo_tiny.yaml", ["trian.lr=1"])
    assert str(e.value).startswith("unknown config key 'trian' (from the command line)")
    assert "did you mean 'train.lr'?" in str(e.value)
    path = tmp_path / "c.yaml"
    path.write_text("trian:\n  lr: 1\n")
    with pytest.raises(ConfigError, match=rf"'trian' \(from file {path}\)"):
        load_config(GRPOConfig, path)


def test_range_text_and_describe_show_the_range() -> None:
    fields = {f.name: f for f in dataclasses.fields(Ranged)}
    shown = {name: range_text(f) for name, f in fields.items()}
    assert shown == {
        "k": ">= 1",
        "every": ">= 0",
        "p": "[0, 1]",
        "lr": "> 0",
        "frac": "(0, 1)",
        "m": ">= 1",
        "betas": "< 1",
        "quotas": ">= 1",
    }
    rows = {line.split()[0]: line for line in describe_config(Outer).splitlines()}
    assert rows["inner.p"].split()[:4] == ["inner.p", "float", "[0,", "1]"]
    assert rows["inner.k"].split()[:5] == ["inner.k", "int", ">=", "1", "1"]
    assert "0: never" in rows["inner.every"]


@pytest.mark.parametrize(
    ("cls", "override", "key"),
    [
        (GRPOConfig, "keep_checkpoints=0", "keep_checkpoints"),
        (GRPOConfig, "n=0", "n"),
        (GRPOConfig, "questions_per_step=0", "questions_per_step"),
        (GRPOConfig, "steps=-1", "steps"),
        (GRPOConfig, "agent.protocol=bogus", "agent.protocol"),
        (GRPOConfig, "eval_every=-1", "eval_every"),
        (EviBackConfig, "keep_checkpoints=0", "keep_checkpoints"),
        (EviBackConfig, "n=0", "n"),
        (EviBackConfig, "agent.protocol=bogus", "agent.protocol"),
        (CERConfig, "group_size=0", "group_size"),
        (CERConfig, "keep_checkpoints=0", "keep_checkpoints"),
        (CERConfig, "loss.aggregation=sum", "loss.aggregation"),
        (ArcoConfig, "env.protocol=bogus", "env.protocol"),
        (ArcoConfig, "rl.kl_direction=sideways", "rl.kl_direction"),
        (ArcoConfig, "method=grpo", "method"),
        (ArcoConfig, "rubric.mode=dense", "rubric.mode"),
        (WarmupConfig, "steps=0", "steps"),
    ],
)
def test_the_issues_bad_values_fail_at_build_naming_the_key(cls, override, key) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(cls, overrides=[override])
    assert str(e.value).startswith(f"config key {key!r} (from the command line)")


@pytest.mark.parametrize("cls", [GRPOConfig, EviBackConfig, CERConfig, ArcoConfig])
def test_eval_every_zero_is_accepted_and_its_help_says_never(cls) -> None:
    assert load_config(cls, overrides=["eval_every=0"]).eval_every == 0
    help_text = {f.name: f for f in dataclasses.fields(cls)}["eval_every"].metadata["help"]
    assert "0: never" in help_text


@pytest.mark.parametrize(
    ("cls", "overrides", "match"),
    [
        (GRPOConfig, ["n=3", "questions_per_step=5"], "questions_per_step\\*n = 15"),
        (EviBackConfig, ["n=3", "questions_per_step=5"], "questions_per_step\\*n = 15"),
        (CERConfig, ["group_size=4", "reward.m=5"], "reward.m=5 exceeds group_size=4"),
        (EviBackConfig, ["ape.candidates_a=2", "ape.gated_from_top=3"], "gated_from_top=3"),
        (ArcoConfig, ["rl.sparse_steps=0", "rl.dense_steps=0"], "sparse_steps \\+ rl.dense"),
    ],
)
def test_cross_field_checks_fail_at_build(cls, overrides, match) -> None:
    with pytest.raises(ConfigError, match=match) as e:
        load_config(cls, overrides=overrides)
    assert "(from the command line)" in str(e.value)


def test_a_cross_field_error_names_every_source_of_the_section(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("n: 3\n")
    with pytest.raises(ConfigError) as e:
        load_config(GRPOConfig, path, ["questions_per_step=5"])
    assert str(e.value).startswith(
        f"config section '<top level>' (from file {path} and the command line): "
        "questions_per_step*n = 15 is not a multiple of loss.micro_batch_size = 16"
    )


def _number_fields():
    """(root, dotted key, field, element type) for every int/float field under every root,
    including Optional numbers and numbers inside list / tuple / dict fields."""
    from common.config import _leaves

    out = []
    for root in ROOTS:
        for key, tp, f, _ in _leaves(root, ""):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            origin = typing.get_origin(tp)
            if origin in (typing.Union, types.UnionType) and len(args) == 1:
                tp = args[0]  # Optional[X]
            elif origin in (list, tuple):
                tp = args[0]
            elif origin is dict:
                tp = args[1]
            if tp in (int, float):
                out.append((root, key, f, tp))
    return out


NUMBER_FIELDS = _number_fields()


def test_every_number_field_has_a_range_or_a_reason() -> None:
    assert len(NUMBER_FIELDS) > 100  # the walk reaches every section
    missing = sorted(
        {
            f"{root.__name__}.{key}"
            for root, key, f, _ in NUMBER_FIELDS
            if not range_text(f) and key not in UNBOUNDED
        }
    )
    assert not missing, f"add 'ge'/'gt'/'le'/'lt' to the field's metadata: {missing}"


def _outside(f: dataclasses.Field, tp: type) -> list:
    """Values just outside each bound of ``f``."""
    step = 1 if tp is int else 1e-6
    m, out = f.metadata, []
    if "ge" in m:
        out.append(m["ge"] - step)
    if "gt" in m:
        out.append(m["gt"])
    if "le" in m:
        out.append(m["le"] + step)
    if "lt" in m:
        out.append(m["lt"])
    return [tp(v) for v in out]


@pytest.mark.parametrize(
    ("root", "key", "f", "tp"),
    [p for p in NUMBER_FIELDS if range_text(p[2])],
    ids=[f"{p[0].__name__}.{p[1]}" for p in NUMBER_FIELDS if range_text(p[2])],
)
def test_every_ranged_field_rejects_values_outside_and_its_default_is_inside(
    root, key, f, tp
) -> None:
    value = root()
    for part in key.split("."):
        value = getattr(value, part)
    values = list(value.values()) if isinstance(value, dict) else value
    for v in values if isinstance(values, list | tuple) else [values]:
        assert v is None or _in_range(f, v), f"the default {v!r} is out of range"
    hint = str(f.type)
    for bad in _outside(f, tp):
        if hint.startswith("dict"):
            value, shown = f"{{x: {bad!r}}}", f"{key}.x"
        elif hint.startswith(("tuple", "list")):
            value, shown = f"[{bad!r}, {bad!r}]", f"{key}[0]"
        else:
            value, shown = repr(bad), key
        with pytest.raises(ConfigError) as e:
            load_config(root, overrides=[f"{key}={value}"])
        assert str(e.value).startswith(f"config key {shown!r} (from the command line)")


def test_eval_every_zero_never_evaluates_and_the_last_step_still_saves() -> None:
    cfg = SimpleNamespace(
        eval_every=0, save_every=0, steps=3
    )  # the old schedule: ZeroDivisionError
    assert [schedule(step, cfg) for step in (1, 2, 3)] == [(False, False)] * 2 + [(False, True)]
    cfg = SimpleNamespace(eval_every=2, save_every=0, steps=5)
    assert [schedule(step, cfg)[0] for step in range(1, 6)] == [False, True, False, True, True]


def _grpo_main(capsys, tmp_path: Path, *overrides: str) -> str:
    """``python -m common.search_grpo`` in process: exit 2 with one line on stderr, no folder."""
    from common.search_grpo import main

    assert main([f"run_dir={tmp_path / 'run'}", *overrides]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()  # no run folder for a run that failed its checks
    return err.strip()


@pytest.fixture
def fake_world(tmp_path: Path) -> Path:
    """A world folder whose files exist; nothing in it loads before the QA files are read."""
    world = tmp_path / "world"
    (world / "model").mkdir(parents=True)
    (world / "corpus.jsonl").write_text('{"id": "0", "contents": "\\"T\\"\\ntext"}\n')
    row = '{"id": "q%d", "question": "who?", "golden_answers": ["x"]}\n'
    (world / "train.jsonl").write_text(row % 1 + row % 2)
    (world / "dev.jsonl").write_text(row % 1)
    return world


def test_search_grpo_config_error_is_one_line_exit_2(capsys, tmp_path, fake_world) -> None:
    line = _grpo_main(capsys, tmp_path, f"assets.world={fake_world}", "eval_every=-1")
    assert line == (
        "search_grpo: error: config key 'eval_every' (from the command line): -1 is out of "
        "range; allowed: >= 0"
    )


def test_search_grpo_missing_input_names_the_real_key(capsys, tmp_path, fake_world) -> None:
    line = _grpo_main(capsys, tmp_path, f"assets.world={tmp_path / 'none'}")
    assert (
        line.startswith("search_grpo: error: model not found at") and "`assets.model=...`" in line
    )
    (fake_world / "train.jsonl").unlink()
    line = _grpo_main(capsys, tmp_path, f"assets.world={fake_world}")
    assert f"train not found at {fake_world / 'train.jsonl'}" in line
    assert "`assets.train=...`" in line


def test_search_grpo_bad_qa_file_is_one_line_before_any_model_loads(tmp_path, fake_world) -> None:
    """As a user runs it: a subprocess, so a traceback or a model load would show."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "question": "q", "golden_answers": ["x"]}\n{"id": "b"}\n')
    run_dir = tmp_path / "run"
    # the world's model folder is empty: had anything tried to load it, the error would differ
    args = [f"assets.world={fake_world}", f"assets.train={bad}", f"run_dir={run_dir}"]
    done = subprocess.run(
        [sys.executable, "-m", "common.search_grpo", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith(f"search_grpo: error: {bad}, line 2: field 'question'")
    assert not run_dir.exists()


@pytest.mark.parametrize(
    ("module", "argv", "key"),
    [
        ("common.warmup", ["steps=0"], "steps"),
        (
            "cer.cli",
            ["train", "--config", str(ROOT / "cer/configs/tiny.yaml"), "group_size=0"],
            "group_size",
        ),
        ("eviback.cli", ["train", "n=0"], "n"),
        ("arco.cli", ["train", "keep_checkpoints=0"], "keep_checkpoints"),
    ],
)
def test_every_command_reports_a_bad_setting_in_one_line(capsys, module, argv, key) -> None:
    import importlib

    assert importlib.import_module(module).main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, err
    assert f"config key {key!r} (from the command line)" in err and "Traceback" not in err
