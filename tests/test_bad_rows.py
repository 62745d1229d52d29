"""Bad data rows are found at load, before any model or engine loads (common.data's module
docstring): a lone surrogate and a non-finite answer are errors naming the file and line, an
over-long question is a counted skip (as CER's over-long prompts), number answers have one text
in the QA and CER loaders, and a parquet file (Search-R1's) is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cer.data import load_math_examples
from common.data import (
    CHARS_PER_TOKEN_BOUND,
    DataError,
    TextTooLong,
    answer_text,
    check_text,
    load_qa,
    question_char_limit,
)
from eviback.assets import load_questions


def _lines(tmp_path: Path, name: str, *lines: str) -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# --- lone surrogates ---------------------------------------------------------------------------


def test_check_text() -> None:
    assert check_text("café 😀", "w") == "café 😀"
    with pytest.raises(DataError, match=r"^w: the lone surrogate '\\ud800' at character 3 "):
        check_text("abc\ud800", "w")
    with pytest.raises(DataError, match=r"^w: expected text, got 7 \(int\)$"):
        check_text(7, "w")
    assert check_text("x" * 8, "w", max_chars=8) == "x" * 8
    with pytest.raises(TextTooLong, match=r"^w: 9 characters, over the bound of 8 "):
        check_text("x" * 9, "w", max_chars=8)


def test_lone_surrogate_question_names_file_and_line(tmp_path: Path) -> None:
    # json.loads reads the escape "\ud800" into a str that no UTF-8 encoder (tokenizer) takes
    path = _lines(
        tmp_path,
        "q.jsonl",
        '{"question": "fine?", "answer": "a"}',
        '{"question": "caf\\ud800?", "answer": "b"}',
    )
    assert "\ud800" in json.loads(path.read_text().splitlines()[1])["question"]
    with pytest.raises(DataError) as e:
        load_qa(path)
    assert str(e.value).startswith(
        f"{path}, line 2: field 'question': the lone surrogate '\\ud800' at character 3 is not text"
    )


def test_lone_surrogate_deep_in_a_row_and_in_a_json_list(tmp_path: Path) -> None:
    row = (
        '{"question": "q?", "golden_answers": ["a"], '
        '"metadata": {"paragraphs": [{"title": "T", "text": "x\\udfff"}]}}'
    )
    path = tmp_path / "list.json"
    path.write_text('[\n{"question": "ok?", "golden_answers": ["a"]},\n\n' + row + "\n]\n")
    with pytest.raises(DataError) as e:
        load_qa(path)
    assert str(e.value).startswith(
        f"{path}, line 4: field 'metadata.paragraphs[0].text': the lone surrogate '\\udfff' "
        "at character 1"
    )


def test_a_surrogate_pair_is_one_character_and_loads(tmp_path: Path) -> None:
    path = _lines(tmp_path, "q.jsonl", '{"question": "\\ud83d\\ude00?", "answer": "smile"}')
    (ex,) = load_qa(path)
    assert ex.question == "😀?"


def test_lone_surrogate_in_a_list_of_dicts() -> None:
    rows = [{"question": "a?", "answer": "x"}, {"question": "b?", "answer": "y\udc80"}]
    with pytest.raises(DataError, match=r"^<list>, row 2: field 'answer': the lone surrogate"):
        load_qa(rows)


def test_lone_surrogate_in_cer_names_file_and_line(tmp_path: Path) -> None:
    path = _lines(
        tmp_path,
        "aime.jsonl",
        '{"problem": "1+1?", "answer": "2"}',
        '{"problem": "x\\ud800 + 1?", "answer": "3"}',
    )
    with pytest.raises(DataError) as e:
        load_math_examples(path)
    assert str(e.value).startswith(
        f"{path}, line 2: field 'problem': the lone surrogate '\\ud800' at character 1"
    )


# --- over-long questions: a counted skip -------------------------------------------------------


def test_question_char_limit() -> None:
    assert CHARS_PER_TOKEN_BOUND == 8
    assert question_char_limit(4096, 1024) == 8192


def test_a_1mb_question_is_a_counted_skip(tmp_path: Path, caplog) -> None:
    huge = "why " * 250_000  # 1,000,000 characters
    path = _lines(
        tmp_path,
        "q.jsonl",
        json.dumps({"id": "a", "question": "short?", "answer": "x"}),
        json.dumps({"id": "b", "question": huge, "answer": "y"}),
        json.dumps({"id": "c", "question": "also short?", "answer": "z"}),
    )
    skipped: list[str] = []
    examples = load_qa(path, max_question_chars=question_char_limit(1024), skipped=skipped)
    assert [ex.id for ex in examples] == ["q:a", "q:c"]
    assert skipped == [
        f"{path}, line 2: question: 1,000,000 characters, over the bound of 8,192 "
        "(the prompt budget in tokens x 8)"
    ]
    assert f"{path}: 1 of 3 rows skipped (first: {skipped[0]})" in caplog.text
    assert len(load_qa(path)) == 3  # no bound: every row


def test_every_question_over_the_bound_is_an_error(tmp_path: Path) -> None:
    path = _lines(tmp_path, "q.jsonl", json.dumps({"question": "x" * 20, "answer": "y"}))
    with pytest.raises(DataError) as e:
        load_qa(path, max_question_chars=10)
    assert str(e.value) == (
        f"{path}: no row left: all 1 questions are over the bound (first: {path}, line 1: "
        "question: 20 characters, over the bound of 10 (the prompt budget in tokens x 8))"
    )


def test_eviback_load_questions_skips_before_quotas(tmp_path: Path) -> None:
    rows = [{"id": str(i), "question": f"question {i}?", "golden_answers": ["a"]} for i in range(4)]
    rows[1]["question"] = "long " * 100  # 500 characters
    path = _lines(tmp_path, "nq.jsonl", *map(json.dumps, rows))
    got = load_questions({"nq": str(path)}, {"nq": 3}, 0, "sha256", max_question_chars=400)
    assert sorted(ex.id for ex in got) == ["nq:0", "nq:2", "nq:3"]
    with pytest.raises(ValueError, match=r"quota nq=4 exceeds the 3 questions"):
        load_questions({"nq": str(path)}, {"nq": 4}, 0, "sha256", max_question_chars=400)


def test_cer_over_long_problem_is_a_counted_skip(tmp_path: Path) -> None:
    path = _lines(
        tmp_path,
        "aime.jsonl",
        json.dumps({"problem": "1+1?", "answer": "2"}),
        json.dumps({"problem": "9" * 100, "answer": "3"}),
    )
    loaded = load_math_examples(path, max_chars=50)
    assert [ex.problem for ex in loaded.examples] == ["1+1?"]
    assert loaded.skipped == [
        f"{path}, line 2: problem: 100 characters, over the bound of 50 "
        "(the prompt budget in tokens x 8)"
    ]


# --- answers: finite numbers, one text ---------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("Paris", "Paris"),
        (7, "7"),
        (-12, "-12"),
        (27.0, "27"),
        (1.5e3, "1500"),
        (-0.0, "0"),
        (0.25, "0.25"),
        (0.1, "0.1"),
        (2.5e-5, "2.5e-05"),
        (2.0**53, "9007199254740992"),
        (2.0**54, "1.8014398509481984e+16"),
        (1e20, "1e+20"),
    ],
)
def test_answer_text(value, text: str) -> None:
    assert answer_text(value) == text


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (float("nan"), r"a non-finite number \(nan\) is not an answer"),
        (float("inf"), r"a non-finite number \(inf\) is not an answer"),
        (True, r"a boolean answer \(True\) is ambiguous: write it as a string"),
        (None, r"expected a string or a number, got None \(NoneType\)"),
    ],
)
def test_answer_text_refuses(value, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        answer_text(value)


def test_nan_and_infinity_answers_name_file_and_line(tmp_path: Path) -> None:
    # Python's json reads the bare NaN and Infinity: today they became the golds "nan" and "inf"
    path = _lines(
        tmp_path,
        "q.jsonl",
        '{"question": "q?", "answer": "a"}',
        '{"question": "r?", "answer": NaN}',
    )
    with pytest.raises(DataError) as e:
        load_qa(path)
    assert str(e.value) == (
        f"{path}, line 2: field 'answer': bad answer: a non-finite number (nan) is not an answer "
        "(simple format)"
    )
    path = _lines(
        tmp_path, "f.jsonl", '{"id": "1", "question": "q?", "golden_answers": ["x", -Infinity]}'
    )
    with pytest.raises(DataError) as e:
        load_qa(path)
    assert str(e.value) == (
        f"{path}, line 1: field 'golden_answers[1]': bad answer: a non-finite number (-inf) is "
        "not an answer (flashrag format)"
    )


def test_nan_answer_in_cer_names_file_and_line(tmp_path: Path) -> None:
    path = _lines(tmp_path, "aime.jsonl", '{"problem": "p?", "answer": NaN}')
    with pytest.raises(DataError) as e:
        load_math_examples(path)
    assert str(e.value) == (
        f"{path}, line 1: field 'answer': a non-finite number (nan) is not an answer"
    )


def test_number_answers_have_one_text_in_both_loaders(tmp_path: Path) -> None:
    # the answers as JSON numbers: 1.5e3 was "1500.0" in common.data and "1500" in CER
    numbers = ["1.5e3", "27.0", "0.25", "7", "2.5e-5"]
    expected = ["1500", "27", "0.25", "7", "2.5e-05"]
    qa = _lines(
        tmp_path,
        "qa.jsonl",
        *(f'{{"question": "q{i}?", "answer": {n}}}' for i, n in enumerate(numbers)),
    )
    cer = _lines(
        tmp_path,
        "cer.jsonl",
        *(f'{{"problem": "p{i}?", "answer": {n}}}' for i, n in enumerate(numbers)),
    )
    assert [ex.golden_answers for ex in load_qa(qa)] == [[t] for t in expected]
    assert [ex.answer for ex in load_math_examples(cer).examples] == expected


# --- parquet (Search-R1's files) ---------------------------------------------------------------


def _search_r1_parquet(path: Path) -> Path:
    """Two rows as Search-R1's scripts/data_process/nq_search.py writes them: FlashRAG's columns
    (id, question, golden_answers) plus data_source, prompt, ability, reward_model, extra_info."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "id": f"train_{i}",
            "question": q,
            "golden_answers": golds,
            "data_source": "nq",
            "prompt": [{"role": "user", "content": f"Answer the given question. Question: {q}\n"}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": golds}},
            "extra_info": {"split": "train", "index": i},
        }
        for i, (q, golds) in enumerate(
            [
                ("who wrote hamlet?", ["William Shakespeare", "Shakespeare"]),
                ("capital of peru?", ["Lima"]),
            ]
        )
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_search_r1_parquet_loads(tmp_path: Path) -> None:
    path = _search_r1_parquet(tmp_path / "train.parquet")
    examples = load_qa(path)
    assert [(ex.id, ex.question, ex.golden_answers) for ex in examples] == [
        ("train:train_0", "who wrote hamlet?", ["William Shakespeare", "Shakespeare"]),
        ("train:train_1", "capital of peru?", ["Lima"]),
    ]
    got = load_questions({"nq": str(path)}, {"nq": 1}, 0, "sha256")
    assert len(got) == 1 and got[0].id in {"nq:train_0", "nq:train_1"}


def test_parquet_by_its_magic_bytes_and_bad_rows_named_by_row(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = _search_r1_parquet(tmp_path / "train.data")  # no .parquet name: PAR1 tells
    assert [ex.id for ex in load_qa(path, source="")] == ["train_0", "train_1"]
    bad = tmp_path / "bad.parquet"
    pq.write_table(
        pa.Table.from_pylist(
            [{"question": "q?", "answer": 1.0}, {"question": "r?", "answer": float("nan")}]
        ),
        bad,
    )
    with pytest.raises(
        DataError, match=rf"^{bad}, row 2: field 'answer': bad answer: a non-finite"
    ):
        load_qa(bad)


def test_a_binary_file_names_the_formats_read(tmp_path: Path) -> None:
    path = tmp_path / "train.bin"
    path.write_bytes(b"\xff\xfe\x00binary")  # what UTF-16 starts with
    with pytest.raises(DataError) as e:
        load_qa(path)
    assert str(e.value) == (
        f"cannot read QA file {path}: not UTF-8 text (line 1, byte 1 of the line is 0xff; the "
        "file is UTF-16 (its byte order mark): save it as UTF-8); the data files read are "
        "jsonl, a JSON list (UTF-8) and parquet (a .parquet name or PAR1 magic bytes)"
    )


@pytest.mark.parametrize("name", ["q.jsonl", "q.json"])
def test_a_utf8_byte_order_mark_is_read_past_in_jsonl_and_json_lists(tmp_path, name) -> None:
    """Windows editors save UTF-8 with a byte order mark: before, line 1 was "invalid JSON:
    Unexpected UTF-8 BOM"."""
    rows = [{"question": "Où?", "answer": "Ici"}, {"question": "B?", "answer": "b"}]
    text = (
        json.dumps(rows, ensure_ascii=False)
        if name.endswith(".json")
        else "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    )
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    got = load_qa(path)
    assert [(ex.id, ex.question, ex.golden_answers) for ex in got] == [
        ("q:0", "Où?", ["Ici"]),
        ("q:1", "B?", ["b"]),
    ]


def test_a_byte_that_is_not_utf8_names_its_line_and_its_byte_in_the_line(tmp_path) -> None:
    """A Latin-1 "é" (0xe9) on line 3, the 17th byte of that line (before: "position 84" of
    the whole file); line 1's bytes count the byte order mark's three, as a hex editor does."""
    path = tmp_path / "q.jsonl"
    good = b'{"question": "A?", "answer": "a"}\n'
    path.write_bytes(
        good + good.replace(b"A?", b"B?") + b'{"question": "caf\xe9?", "answer": "c"}\n'
    )
    with pytest.raises(DataError, match=r"not UTF-8 text \(line 3, byte 18 of the line is 0xe9\)"):
        load_qa(path)
    path.write_bytes(b'\xef\xbb\xbf{"question": "\xe9", "answer": "a"}\n')
    with pytest.raises(DataError, match=r"not UTF-8 text \(line 1, byte 18 of the line is 0xe9\)"):
        load_qa(path)
