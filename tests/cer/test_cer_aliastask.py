from __future__ import annotations

import json
from pathlib import Path

import pytest

from cer.aliastask import build, count_forms, main, person_forms, population_forms
from cer.answer import last_boxed
from cer.data import load_math_examples
from cer.group_reward import is_correct, is_exact, verifier_name
from cer.verifiers import alias_verifier, exact_verifier, normalize_alias

FILES = ("train.jsonl", "dev.jsonl", "test.jsonl", "warmstart.jsonl", "meta.json")
KINDS = {"director", "founder", "count", "population", "birth_year", "capital"}


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("alias"), seed=3, n_train=300, n_dev=60, n_test=60)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_same_seed_same_bytes(task, tmp_path):
    argv = ["build", "--out", str(tmp_path), "--seed", "3"]
    main(argv + ["--n-train", "300", "--n-dev", "60", "--n-test", "60"])
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (task / name).read_bytes(), name
    other = build(tmp_path / "other", seed=4, n_train=300, n_dev=60, n_test=60)
    assert (other / "train.jsonl").read_bytes() != (task / "train.jsonl").read_bytes()


def test_splits_are_disjoint_sized_and_mixed(task):
    problems = {
        name: {r["problem"] for r in _rows(task / f"{name}.jsonl")}
        for name in ("train", "dev", "test")
    }
    assert [len(p) for p in problems.values()] == [300, 60, 60]
    assert not problems["train"] & problems["dev"]
    assert not problems["train"] & problems["test"]
    assert not problems["dev"] & problems["test"]
    meta = json.loads((task / "meta.json").read_text())
    assert meta["task"] == "alias" and meta["sizes"] == {"train": 300, "dev": 60, "test": 60}
    assert set(meta["kinds"]) == KINDS
    assert meta["with_aliases"] > 0.5


def test_rows_have_the_loader_fields_and_their_answer_in_the_context(task):
    for row in _rows(task / "dev.jsonl"):
        assert set(row) == {"id", "kind", "problem", "answer", "answer_forms", "verifier"}
        assert row["verifier"] == "alias" and row["answer"] == row["answer_forms"][0]
        context, question = row["problem"].split("\nQuestion: ")
        assert context.startswith("Context: ") and question.endswith("?")
        if row["kind"] != "count":
            assert row["answer"] in context, row
        for form in row["answer_forms"]:
            assert alias_verifier(form, row["answer_forms"])


def test_warm_start_answers_are_forms_and_often_defeat_exact_match(task):
    train = {r["id"]: r for r in _rows(task / "train.jsonl")}
    warm = _rows(task / "warmstart.jsonl")
    assert len(warm) == len(train)
    differ = 0
    for row in warm:
        gold = train[row["id"]]
        assert row["problem"] == gold["problem"]
        assert last_boxed(row["solution"]) == row["answer"]
        assert row["answer"] in gold["answer_forms"]
        assert alias_verifier(row["answer"], gold["answer_forms"])
        differ += not exact_verifier(row["answer"], gold["answer"])
    assert differ / len(warm) > 0.2


def test_splits_load_and_the_rule_is_the_alias_oracle(task):
    examples = load_math_examples(task / "dev.jsonl", source="").examples
    assert len(examples) == 60 and examples[0].id == "alias-dev-00000"
    warm = load_math_examples(task / "warmstart.jsonl").examples
    assert len(warm) == 300 and "\\boxed{" in warm[0].metadata["solution"]
    aliased = next(ex for ex in examples if len(ex.metadata["answer_forms"]) > 1)
    alias = aliased.metadata["answer_forms"][1]
    assert verifier_name(aliased) == "alias"
    assert is_correct(alias, aliased) and not is_exact(alias, aliased)
    assert is_correct(aliased.answer, aliased) and is_exact(aliased.answer, aliased)
    assert not is_correct(None, aliased) and not is_correct("Nobody", aliased)


PERSON = ["Tusha Shusti", "Shusti"]


@pytest.mark.parametrize(
    ("answer", "forms", "ok"),
    [
        ("Tusha Shusti", PERSON, True),  # canonical
        ("Shusti", PERSON, True),  # surname alias
        ("tusha  shusti", PERSON, True),  # case and whitespace
        ("\\text{Shusti}.", PERSON, True),  # wrapper and trailing period
        ("$Tusha Shusti$", PERSON, True),
        ("Tusha", PERSON, False),  # a given name alone is not a listed form
        ("Shusti Tusha", PERSON, False),
        ("Tusha Shust", PERSON, False),
        ("Tusha Shusti Bo", PERSON, False),
        ("Kem Shusa", PERSON, False),  # another person
        ("", PERSON, False),
        ("2", ["2", "two"], True),
        ("two", ["2", "two"], True),
        ("Two", ["2", "two"], True),
        ("3", ["2", "two"], False),
        ("2.0", ["2", "two"], False),
        ("2,795,000", ["2,795,000", "2795000"], True),
        ("2795000", ["2,795,000", "2795000"], True),
        ("2,795", ["2,795,000", "2795000"], False),
        ("2795", ["2,795,000", "2795000"], False),
    ],
)
def test_alias_oracle(answer, forms, ok):
    assert alias_verifier(answer, forms) is ok


def test_exact_rejects_an_alias_the_oracle_accepts():
    for forms in (PERSON, ["2", "two"], ["2,795,000", "2795000"]):
        assert exact_verifier(forms[0], forms[0])
        assert not exact_verifier(forms[1], forms[0])
        assert alias_verifier(forms[1], forms)


def test_forms_and_normalisation():
    assert person_forms("Tusha Shusti") == ("Tusha Shusti", "Shusti")
    assert count_forms(3) == ("3", "three") and count_forms(12) == ("12",)
    assert population_forms(2795000) == ("2,795,000", "2795000")
    assert normalize_alias(" $\\text{Tusha   SHUSTI}$. ") == "tusha shusti"
    assert normalize_alias("1,000 and 2, 3") == "1000 and 2, 3"
