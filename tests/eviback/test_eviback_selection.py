"""The release's question selection: dedup by normalised question, then a SHA-256 rank per source
with the selection seed, on a hand-made FlashRAG-format file."""

from __future__ import annotations

import hashlib
import json

import pytest

from common.config import load_config
from eviback.assets import load_questions, select_questions, selection_key
from eviback.config import EviBackConfig

ROWS = [
    {"id": "train_0", "question": "Who wrote Hamlet?", "golden_answers": ["Shakespeare"]},
    {"id": "train_1", "question": "  who WROTE   hamlet? ", "golden_answers": ["W. Shakespeare"]},
    {"id": "train_2", "question": "Capital of Peru?", "golden_answers": ["Lima"]},
    {"id": "train_3", "question": "Tallest mountain?", "golden_answers": ["Everest"]},
    {"id": "train_5", "question": "Ｆｕｌｌ width?", "golden_answers": ["yes"]},
]


def digest(row_id: str, question_key: str, source: str, seed: int) -> str:
    """By hand: the canonical JSON, keys sorted, no spaces."""
    text = f'{{"id":"{row_id}","question":"{question_key}","seed":{seed},"source":"{source}"}}'
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def expected_order(source: str, seed: int) -> list[str]:
    keys = {
        "train_0": digest("train_0", "who wrote hamlet?", source, seed),
        "train_1": digest("train_1", "who wrote hamlet?", source, seed),
        "train_2": digest("train_2", "capital of peru?", source, seed),
        "train_3": digest("train_3", "tallest mountain?", source, seed),
        "train_5": digest("train_5", "full width?", source, seed),  # NFKC folds the full width
    }
    dup = min(("train_0", "train_1"), key=keys.get)  # one of the two Hamlet rows: the lower key
    kept = [dup, "train_2", "train_3", "train_5"]
    return sorted(kept, key=keys.get)


@pytest.fixture
def qa_file(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ROWS))
    return path


def test_selection_key_is_the_sha256_of_the_canonical_identity():
    assert selection_key("train_2", " Capital of  PERU? ", "nq", 7) == digest(
        "train_2", "capital of peru?", "nq", 7
    )


@pytest.mark.parametrize("seed", [26041755, 42, 7])
def test_sha256_selection_dedups_then_ranks(qa_file, seed):
    order = expected_order("2wikimultihopqa", seed)
    got = load_questions({"2wiki": str(qa_file)}, {"2wiki": 3}, seed, "sha256",
                         {"2wiki": "2wikimultihopqa"})  # fmt: skip
    assert [ex.id for ex in got] == [f"2wiki:{i}" for i in order[:3]]
    # the release name enters the key: under "2wiki" the order is that of another source name
    plain = load_questions({"2wiki": str(qa_file)}, {"2wiki": 4}, seed, "sha256")
    assert [ex.id for ex in plain] == [f"2wiki:{i}" for i in expected_order("2wiki", seed)]


def test_quota_over_the_distinct_answerable_questions_is_an_error(qa_file):
    with pytest.raises(ValueError, match="quota nq=5 exceeds the 4 distinct answerable"):
        load_questions({"nq": str(qa_file)}, {"nq": 5}, 42, "sha256")
    with pytest.raises(ValueError, match="selection must be one of"):
        load_questions({"nq": str(qa_file)}, {"nq": 1}, 42, "first")


def test_select_questions_uses_each_sets_seed(qa_file):
    cfg = load_config(EviBackConfig, None, [
        f"assets.train={{nq: {qa_file}}}", "assets.train_quotas={nq: 2}",
        f"assets.eval={{nq: {qa_file}}}", "assets.eval_quotas={nq: 2}",
    ])  # fmt: skip
    assert (cfg.assets.selection, cfg.assets.train_selection_seed) == ("sha256", 26041755)
    train = [ex.id for ex in select_questions(cfg.assets, "train", seed=0)]
    evals = [ex.id for ex in select_questions(cfg.assets, "eval", seed=0)]
    assert train == [f"nq:{i}" for i in expected_order("nq", 26041755)[:2]]
    assert evals == [f"nq:{i}" for i in expected_order("nq", 42)[:2]]
    cfg.assets.selection = "random"
    a = select_questions(cfg.assets, "train", seed=0)
    assert a == select_questions(cfg.assets, "train", seed=0) and len(a) == 2
