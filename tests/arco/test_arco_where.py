"""assets.train_where / dev_where: ARCO's question filters (the long-trajectory setting)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arco.config import ArcoConfig, AssetsConfig
from common.config import ConfigError, load_config
from common.data import DataError, load_qa_where

ROOT = Path(__file__).resolve().parents[2]


def _write(path: Path, hops: list[int]) -> Path:
    rows = [
        {"id": f"q{i}", "question": f"question {i}?", "golden_answers": [f"a{i}"],
         "metadata": {"hops": h, "type": "bridge" if h > 1 else "single_hop"}}
        for i, h in enumerate(hops)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_questions_keeps_the_rows_whose_metadata_matches_as_text(tmp_path):
    train = _write(tmp_path / "train.jsonl", [1, 3, 2, 3, 3])
    dev = _write(tmp_path / "dev.jsonl", [3, 1])
    assets = AssetsConfig(
        train=str(train), dev=str(dev), train_where={"hops": ["3"]},
        dev_where={"hops": [3], "type": ["bridge"]},
    )  # fmt: skip
    assert [q.id for q in assets.questions("train")] == ["train:q1", "train:q3", "train:q4"]
    assert [q.id for q in assets.questions("dev")] == ["dev:q0"]
    assert len(AssetsConfig(train=str(train)).questions("train")) == 5  # no filter: all
    # arco eval: each benchmark kept by eval_where; without assets.eval, the dev set (dev_where)
    assert {k: [q.id for q in v] for k, v in assets.benchmarks().items()} == {"dev": ["dev:q0"]}
    both = AssetsConfig(eval={"a": str(train), "b": str(dev)}, eval_where={"hops": ["3"]})
    assert {k: len(v) for k, v in both.benchmarks().items()} == {"a": 3, "b": 1}


def test_a_value_no_row_has_or_an_empty_selection_is_a_clear_error(tmp_path):
    train = _write(tmp_path / "train.jsonl", [1, 2])
    with pytest.raises(
        DataError, match=r"assets.train_where: hops=4 matches no question in .*train"
    ):
        load_qa_where(train, {"hops": ["2", "4"]}, "assets.train_where")
    with pytest.raises(DataError, match="no question of .* matches every key"):
        load_qa_where(train, {"hops": ["2"], "type": ["single_hop"]}, "assets.train_where")
    with pytest.raises(ValueError, match="assets.dev_where.hops must list at least one"):
        AssetsConfig(dev_where={"hops": []})


def test_the_long_setting_loads_with_its_filters_and_budget():
    cfg = load_config(ArcoConfig, ROOT / "arco" / "configs" / "tiny_long.yaml", [])
    kinds = {"relation": ["director_birth_country", "founder_birth_country"]}
    assert cfg.assets.train_where == cfg.assets.dev_where == cfg.assets.eval_where == kinds
    assert "renamed1" in cfg.assets.train and "renamed1" in cfg.assets.corpus  # the world
    assert (
        cfg.assets.model
        == load_config(ArcoConfig, ROOT / "arco/configs/tiny.yaml", []).assets.model
    )
    assert cfg.env.max_searches == 6 and "6 searches" in cfg.rubric.task
    assert (
        cfg.warmup.questions + cfg.warmup.select_questions <= 240
    )  # the kinds' training questions
    assert cfg.warmup_dir != load_config(ArcoConfig, ROOT / "arco/configs/tiny.yaml", []).warmup_dir
    with pytest.raises(ConfigError, match="train_where"):
        load_config(
            ArcoConfig,
            ROOT / "arco" / "configs" / "tiny_long.yaml",
            ["assets.train_where={relation: []}"],
        )


def test_a_question_over_the_prompt_budget_is_a_counted_skip_in_arco_too(tmp_path):
    """ARCO's questions take the character bound of its prompt budget: 8 x min(agent.max_context,
    engine.max_model_len); a 1 MB question is skipped at load, not met at step 1."""
    dev = _write(tmp_path / "dev.jsonl", [1, 2, 3])
    rows = dev.read_text().splitlines()
    big = json.loads(rows[1]) | {"question": "x" * 1_000_000}
    dev.write_text("\n".join([rows[0], json.dumps(big), rows[2]]) + "\n")
    cfg = ArcoConfig()
    assert cfg.question_chars() == 8 * min(cfg.agent.max_context, cfg.engine.max_model_len)
    assets = AssetsConfig(dev=str(dev))
    assert [q.id for q in assets.questions("dev", cfg.question_chars())] == ["dev:q0", "dev:q2"]
    assert [q.id for q in assets.benchmarks(cfg.question_chars())["dev"]] == ["dev:q0", "dev:q2"]
    assert len(assets.questions("dev")) == 3  # no bound given: every row
