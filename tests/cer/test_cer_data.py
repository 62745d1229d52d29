from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cer.data import DataError, load_math_examples, render_options, webinstruct_paper_filter

DATA = Path(__file__).parents[1] / "data" / "cer"


def test_math_train_gold_is_the_last_box_and_skips_are_reported(caplog):
    loaded = load_math_examples(DATA / "math_train_handmade.jsonl")
    assert [ex.answer for ex in loaded.examples] == ["2", "\\frac{1}{2}", "12"]
    assert [ex.id for ex in loaded.examples] == [
        "math_train_handmade:0",
        "math_train_handmade:1",
        "math_train_handmade:3",
    ]
    first = loaded.examples[0]
    assert first.problem == "What is $1 + 1$?"
    assert first.metadata == {
        "level": "Level 1",
        "type": "Prealgebra",
        "solution": "We add: $1 + 1 = \\boxed{2}$.",
    }
    assert loaded.skipped == [
        f"{DATA / 'math_train_handmade.jsonl'}, line 3: no \\boxed{{}} answer in the solution"
    ]
    assert "1 of 4 rows skipped" in caplog.text


def test_answer_style_files():
    math500 = load_math_examples(DATA / "math500_handmade.json").examples
    assert [(ex.id, ex.problem, ex.answer) for ex in math500] == [
        ("math500_handmade:test/algebra/1.json", "Compute $2^3$.", "8"),
        ("math500_handmade:test/algebra/2.json", "What is $\\sqrt{16}$?", "4"),
    ]
    assert math500[0].metadata["subject"] == "Algebra"
    amc = load_math_examples(DATA / "amc_handmade.jsonl").examples
    assert [(ex.id, ex.problem, ex.answer) for ex in amc] == [
        ("amc_handmade:0", "How many sides does a hexagon have?", "6"),
        ("amc_handmade:1", "What is half of 5?", "2.5"),
    ]


def test_webinstruct_and_the_paper_filter():
    examples = load_math_examples(DATA / "webinstruct_handmade.jsonl", source="").examples
    assert [ex.id for ex in examples] == ["w1", "w2", "w3", "w4"]
    assert examples[0].metadata == {
        "answer_type": "String",
        "category": "Physics",
        "difficulty": "University",
    }
    assert [ex.id for ex in webinstruct_paper_filter(examples)] == ["w1", "w4"]


def test_multiple_choice():
    mmlu = load_math_examples(DATA / "mmlu_pro_handmade.jsonl").examples
    assert mmlu[0].problem == (
        "Which planet is closest to the Sun?\nA. Venus\nB. Earth\nC. Mercury\nD. Mars"
    )
    assert [ex.answer for ex in mmlu] == ["C", "B"]
    assert mmlu[1].problem.endswith("\nJ. 12")
    assert mmlu[0].metadata["multiple_choice"] is True
    assert mmlu[0].id == "mmlu_pro_handmade:70"
    gpqa = load_math_examples(DATA / "supergpqa_handmade.jsonl").examples
    assert gpqa[0].answer == "C"
    assert gpqa[0].problem.splitlines()[3] == "C. Carbon dioxide"
    assert gpqa[0].metadata["answer"] == "Carbon dioxide"


def test_render_options():
    assert render_options("Q?", ["x", "y"]) == "Q?\nA. x\nB. y"


def test_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "aime.parquet"
    pq.write_table(pa.Table.from_pylist([{"problem": "P1", "answer": "7", "id": "a"}]), path)
    (ex,) = load_math_examples(path).examples
    assert (ex.id, ex.problem, ex.answer) == ("aime:a", "P1", "7")


def _write(tmp_path: Path, rows: list) -> Path:
    path = tmp_path / "bad.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    ("rows", "format", "message"),
    [
        (
            [{"problem": "p", "answer": "1"}, {"problem": "p"}],
            "auto",
            "line 2: missing field 'answer'",
        ),
        ([{"problem": "p", "answer": "1"}, '{"problem": '], "auto", "line 2: invalid JSON"),
        ([{"problem": "", "answer": "1"}], "auto", "line 1: field 'problem' must be a non-empty"),
        (
            [{"problem": "p", "answer": None}],
            "answer",
            "line 1: field 'answer' must be a string or",
        ),
        ([{"problem": "p", "solution": 3}], "math", "line 1: field 'solution' must be"),
        (
            [{"question": "q", "options": ["a", "b"], "answer": "C"}],
            "auto",
            "'answer' must be one of",
        ),
        (
            [{"question": "q", "options": ["a", "b"], "answer": "A", "answer_index": 1}],
            "mmlu_pro",
            "disagrees",
        ),
        ([{"question": "q", "options": "a b", "answer_letter": "A"}], "auto", "'options' must be"),
        (
            [{"question": "q", "answer": "1", "answer_type": "Integer", "category": "Physics"}],
            "auto",
            "missing field 'difficulty'",
        ),
        ([{"text": "what"}], "auto", "cannot tell the format"),
        (
            [{"problem": "p", "answer": "1", "verifier": "fuzzy", "answer_forms": ["1"]}],
            "auto",
            "line 1: field 'verifier' must be one of",
        ),
        (
            [{"problem": "p", "answer": "1", "verifier": "alias"}],
            "auto",
            "line 1: verifier 'alias' needs field 'answer_forms'",
        ),
        (
            [{"problem": "p", "answer": "1", "verifier": "alias", "answer_forms": ["one", "1"]}],
            "auto",
            "line 1: field 'answer_forms' must start with the answer",
        ),
        (
            [{"problem": "p", "answer": "1", "verifier": "alias", "answer_forms": ["1", ""]}],
            "auto",
            "line 1: field 'answer_forms' must hold non-empty strings",
        ),
        ([[1, 2]], "answer", "expected a JSON object"),
    ],
)
def test_bad_rows_name_file_line_and_field(tmp_path, rows, format, message):
    path = _write(tmp_path, rows)
    with pytest.raises(DataError, match=message) as err:
        load_math_examples(path, format=format)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("key", ["id", "unique_id", "idx"])
def test_repeated_ids_are_rejected_naming_both_lines(tmp_path, key):
    """The rule of common.data.load_qa: an id appears once in a file (a repeat would pair two
    problems' results in a comparison, or drop one)."""
    rows = [{key: 7, "problem": "p", "answer": "1"}, {key: 8, "problem": "q", "answer": "2"}]
    path = _write(tmp_path, [*rows, {key: 7, "problem": "r", "answer": "3"}])
    with pytest.raises(DataError) as err:
        load_math_examples(path)
    assert str(err.value) == f"{path}, line 3: duplicate id '7' (first at line 1)"
    assert [ex.id for ex in load_math_examples(_write(tmp_path, rows)).examples] == [
        "bad:7",
        "bad:8",
    ]


def test_bad_json_list_names_the_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[\n  {"problem": "p", "answer": "1"},\n  {"problem": }\n]\n')
    with pytest.raises(DataError, match="line 3: invalid JSON"):
        load_math_examples(path)


def test_unknown_format_and_missing_file(tmp_path):
    with pytest.raises(DataError, match="unknown format 'gsm'"):
        load_math_examples(DATA / "amc_handmade.jsonl", format="gsm")
    with pytest.raises(DataError, match="cannot read"):
        load_math_examples(tmp_path / "missing.jsonl")
    with pytest.raises(DataError, match="not of the form"):
        load_math_examples("hf://only-a-name")


def test_hub_offline_is_a_clear_error():
    """Offline, a hub id that is not cached is a DataError that says so (in a fresh process:
    the offline switches are read when datasets is imported)."""
    code = (
        "from cer.data import load_math_examples, DataError\n"
        "try:\n"
        "    load_math_examples('hf://nobody-here/no-such-set@train')\n"
        "except DataError as e:\n"
        "    print(e)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[2],
    )
    assert run.returncode == 0, run.stderr
    assert "cannot load hf://nobody-here/no-such-set@train from the Hugging Face hub" in run.stdout
    assert "point to a local file" in run.stdout


def test_cli_reports_a_bad_data_file_before_any_model_loads(tmp_path, capsys, char_tokenizer):
    from cer.cli import main

    model = tmp_path / "model"
    char_tokenizer.save_pretrained(model)
    (model / "config.json").write_text("{}")  # no model: loading one would fail otherwise
    good = {"problem": "p", "answer": "1"}
    bad = _write(tmp_path, [good, {"problem": "q"}])
    dev = tmp_path / "dev.jsonl"
    dev.write_text(json.dumps(good) + "\n")
    run_dir = tmp_path / "run"
    argv = [
        f"assets.model={model}",
        f"assets.train={bad}",
        f"assets.dev={dev}",
        f"run_dir={run_dir}",
    ]
    assert main(["train", "--config", "cer/configs/tiny.yaml", *argv]) == 2
    out, err = capsys.readouterr()
    assert err == f"error: {bad}, line 2: missing field 'answer'\n" and out == ""
    assert not run_dir.exists()  # the data is read before the run folder opens
