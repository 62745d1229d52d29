from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from cer.data import load_math_examples
from cer.rewards.answer import last_boxed
from cer.rewards.verifiers import exact_verifier, rule_verifier
from cer.tasks.arithmetic import build, decimal_text, main, number_forms

FILES = ("train.jsonl", "dev.jsonl", "test.jsonl", "warmup.jsonl", "meta.json")


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("tiny"), seed=3, n_train=300, n_dev=60, n_test=60)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_same_seed_same_bytes(task, tmp_path):
    main(
        [
            "build",
            "--out",
            str(tmp_path),
            "--seed",
            "3",
            "--n-train",
            "300",
            "--n-dev",
            "60",
            "--n-test",
            "60",
        ]
    )
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (task / name).read_bytes(), name
    other = build(tmp_path / "other", seed=4, n_train=300, n_dev=60, n_test=60)
    assert (other / "train.jsonl").read_bytes() != (task / "train.jsonl").read_bytes()


def test_splits_are_disjoint_and_sized(task):
    problems = {
        name: {r["problem"] for r in _rows(task / f"{name}.jsonl")}
        for name in ("train", "dev", "test")
    }
    assert [len(p) for p in problems.values()] == [300, 60, 60]
    assert not problems["train"] & problems["dev"]
    assert not problems["train"] & problems["test"]
    assert not problems["dev"] & problems["test"]
    meta = json.loads((task / "meta.json").read_text())
    assert meta["sizes"] == {"train": 300, "dev": 60, "test": 60}
    assert set(meta["kinds"]) == {"arithmetic", "fraction", "decimal", "units", "percent", "word"}


def test_rule_verifier_accepts_every_form_of_every_dev_answer(task):
    for row in _rows(task / "dev.jsonl"):
        assert row["answer"] == row["answer_forms"][0]
        assert len(row["answer_forms"]) >= 2
        for form in row["answer_forms"]:
            assert rule_verifier(form, row["answer"]), (row["problem"], form)


def test_warmup_answers_defeat_exact_match_not_the_rule(task):
    train = {r["id"]: r for r in _rows(task / "train.jsonl")}
    warm = _rows(task / "warmup.jsonl")
    assert len(warm) == len(train)
    differ = 0
    for row in warm:
        gold = train[row["id"]]
        assert row["problem"] == gold["problem"]
        assert last_boxed(row["solution"]) == row["answer"]
        assert row["answer"] in gold["answer_forms"]
        differ += not exact_verifier(row["answer"], gold["answer"])
    assert differ / len(warm) > 0.2
    for row in warm[:40]:
        assert rule_verifier(row["answer"], train[row["id"]]["answer"])


def test_splits_load_as_answer_examples(task):
    examples = load_math_examples(task / "dev.jsonl", source="").examples
    assert examples[0].id == "tiny-dev-00000"
    assert examples[0].metadata["answer_forms"][0] == examples[0].answer


@pytest.mark.parametrize(
    ("x", "text"),
    [
        (Fraction(3, 4), "0.75"),
        (Fraction(12), "12"),
        (Fraction(1, 3), None),
        (Fraction(7, 20), "0.35"),
    ],
)
def test_decimal_text(x, text):
    assert decimal_text(x) == text


def test_number_forms():
    assert number_forms(Fraction(3, 4)) == ("0.75", "\\frac{3}{4}", "3/4", "0.750")
    assert number_forms(Fraction(1, 3)) == ("\\frac{1}{3}", "1/3", "\\dfrac{1}{3}")
    assert number_forms(Fraction(5), unit="m") == ("5", "5.0", "5\\text{ m}")
