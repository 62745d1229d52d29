"""A paper-scale EviBack config whose assets are missing names every one of them, with how to get
each kind once; a single missing asset keeps its one-line message."""

from __future__ import annotations

import pytest

from eviback.config import HOW_TO_GET, EviBackConfig


def _cfg(tmp_path, **assets) -> EviBackConfig:
    cfg = EviBackConfig()
    cfg.assets.model = str(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    for key, value in assets.items():
        setattr(cfg.assets, key, value)
    return cfg


def test_every_missing_asset_is_listed(tmp_path):
    cfg = _cfg(tmp_path, train={"nq": "no/nq.jsonl", "hotpotqa": "no/hotpot.jsonl"},
               dev={"nq": "no/dev.jsonl"}, corpus="no/wiki")  # fmt: skip
    with pytest.raises(FileNotFoundError) as err:
        cfg.check_assets(("model", "train", "dev", "retrieval"))
    lines = str(err.value).splitlines()
    assert lines[0] == "4 inputs missing:"
    assert lines[1:5] == [
        "  - assets.train.nq: no/nq.jsonl not found",
        "  - assets.train.hotpotqa: no/hotpot.jsonl not found",
        "  - assets.dev.nq: no/dev.jsonl not found",
        "  - assets.corpus: no/wiki is neither a corpus file nor an index folder",
    ]
    assert lines[5:] == ["To get them:", f"  - {HOW_TO_GET['qa']}", f"  - {HOW_TO_GET['corpus']}"]


def test_one_missing_asset_keeps_its_message(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("")
    cfg = _cfg(tmp_path, train={"nq": "no/nq.jsonl"}, dev={"nq": str(corpus)},
               corpus=str(corpus))  # fmt: skip
    with pytest.raises(FileNotFoundError, match="^assets.train.nq: no/nq.jsonl not found. "
                       "To get it: the tiny world"):  # fmt: skip
        cfg.check_assets()
    cfg.assets.train = {}
    with pytest.raises(ValueError, match="^assets.train is empty"):
        cfg.check_assets()
