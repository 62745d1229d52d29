"""A ``datasets.Dataset`` (or a list of dicts) where a data file is: ``common.data.load_qa`` and
``cer.data.load_math_examples`` parse its rows with the file's row parsers, and a bad row is named
``<Dataset>, row N`` (1-based)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from datasets import Dataset, DatasetDict

from cer.data import load_math_examples
from common.data import DataError, load_qa, load_qa_where, read_json_rows

DATA = Path(__file__).parent / "data"
SIMPLE = [
    {"id": "a", "question": "Who wrote Hamlet?", "answer": ["Shakespeare", "W. Shakespeare"]},
    {"id": "b", "question": "Capital of France?", "answer": ["Paris"]},
]


def test_a_dataset_loads_like_its_rows():
    examples = load_qa(Dataset.from_list(SIMPLE))
    assert [(e.id, e.question, e.golden_answers) for e in examples] == [
        ("a", "Who wrote Hamlet?", ["Shakespeare", "W. Shakespeare"]),
        ("b", "Capital of France?", ["Paris"]),
    ]
    assert load_qa(SIMPLE) == examples
    assert [e.id for e in load_qa(Dataset.from_list(SIMPLE), source="mine")] == ["mine:a", "mine:b"]


def test_a_list_of_a_files_rows_loads_like_the_file():
    """The same parsers: a FlashRAG file's rows (mixed types, which Arrow would not hold in one
    column) given as a list equal the file read with no source."""
    path = DATA / "qa" / "flashrag_handmade.jsonl"
    rows = [row for _, row in read_json_rows(path)]
    assert load_qa(rows) == load_qa(path, source="")


def test_a_dataset_without_ids_gets_the_row_index():
    rows = [{"question": "q1?", "answer": "x"}, {"question": "q2?", "answer": "3"}]
    examples = load_qa(Dataset.from_list(rows), format="simple")
    assert [(e.id, e.golden_answers) for e in examples] == [("0", ["x"]), ("1", ["3"])]


def test_a_bad_row_is_named_by_its_dataset_row():
    rows = [*SIMPLE, {"id": "c", "question": "", "answer": ["x"]}]
    with pytest.raises(DataError, match=r"^<Dataset>, row 3: field 'question': is empty"):
        load_qa(Dataset.from_list(rows))
    with pytest.raises(DataError, match=r"^<list>, row 2: field '<row>': expected a JSON object"):
        load_qa([SIMPLE[0], "not a row"])
    with pytest.raises(DataError, match=r"^<Dataset>, row 2: duplicate id 'a' \(first at row 1\)"):
        load_qa(Dataset.from_list([SIMPLE[0], SIMPLE[0]]))


def test_what_is_not_a_dataset_is_refused():
    with pytest.raises(DataError, match=r"DatasetDict of the splits \['train'\]: pass one split"):
        load_qa(DatasetDict({"train": Dataset.from_list(SIMPLE)}))
    with pytest.raises(DataError, match=r"^<list>: no rows"):
        load_qa([])
    with pytest.raises(DataError, match="expected a file path, a datasets.Dataset or a list"):
        load_qa(42)


def test_load_qa_where_names_the_dataset():
    ds = Dataset.from_list([{**row, "split": "dev"} for row in SIMPLE])
    assert [e.id for e in load_qa_where(ds, {"split": ["dev"]})] == ["a", "b"]
    with pytest.raises(DataError, match=r"where: split=test matches no question in <Dataset>"):
        load_qa_where(ds, {"split": ["test"]})


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("name", ["amc_handmade.jsonl", "mmlu_pro_handmade.jsonl"])
def test_cer_loads_a_dataset_like_the_file(name):
    path = DATA / "cer" / name
    from_file = load_math_examples(path, source="")
    from_dataset = load_math_examples(Dataset.from_list(jsonl(path)))
    assert from_dataset == from_file and from_file.examples
    assert load_math_examples(jsonl(path), source="x").examples[0].id.startswith("x:")


def test_cer_skips_and_errors_name_the_dataset_row():
    rows = [
        {"problem": "1 + 1?", "solution": "It is $\\boxed{2}$."},
        {"problem": "No box?", "solution": "It is 3."},
    ]
    loaded = load_math_examples(Dataset.from_list(rows))
    assert [(e.id, e.answer) for e in loaded.examples] == [("0", "2")]
    assert loaded.skipped == ["<Dataset>, row 2: no \\boxed{} answer in the solution"]
    bad = [{"question": "2 + 2?", "answer": "4"}, {"question": "3 + 3?", "answer": ""}]
    with pytest.raises(DataError, match=r"^<Dataset>, row 2: field 'answer' is empty"):
        load_math_examples(Dataset.from_list(bad))
    with pytest.raises(DataError, match=r"^<list>: no rows"):
        load_math_examples([])
