"""Records, the Search-R1 corpus format and the document rendering."""

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.retrieval import CorpusError, Doc, doc_contents, format_docs, read_corpus
from common.retrieval.base import parse_contents

DATA = Path(__file__).parent / "data" / "retrieval"


def search_r1_passages2string(contents: list[str]) -> str:
    """Search-R1's own rendering (search_r1/llm_agent/generation.py, _passages2string)."""
    out = ""
    for idx, content in enumerate(contents):
        title = content.split("\n")[0]
        text = "\n".join(content.split("\n")[1:])
        out += f"Doc {idx + 1}(Title: {title}) {text}\n"
    return out


def test_parse_contents_strips_title_quotes():
    assert parse_contents('"Evan Morris"\nEvan Morris was a lobbyist.') == (
        "Evan Morris",
        "Evan Morris was a lobbyist.",
    )
    assert parse_contents('"Say "Hi""\nA song.\nSecond line.') == (
        'Say "Hi"',
        "A song.\nSecond line.",
    )
    assert parse_contents("Unquoted\ntext") == ("Unquoted", "text")
    assert parse_contents("no newline at all") == ("", "no newline at all")


@given(title=st.text().filter(lambda t: "\n" not in t), text=st.text())
def test_contents_round_trip(title, text):
    assert parse_contents(doc_contents(Doc("x", title, text, 0.0))) == (title, text)


def test_doc_contents_rejects_newline_in_title():
    with pytest.raises(ValueError, match="'d7'.*newline"):
        doc_contents(Doc("d7", "a\nb", "text", 0.0))


def test_real_search_r1_corpus_round_trips_exactly():
    rows = [json.loads(line) for line in (DATA / "wiki18_sample_corpus.jsonl").open()]
    docs = read_corpus(DATA / "wiki18_sample_corpus.jsonl")
    assert [d.id for d in docs] == [str(i) for i in range(10)]
    assert docs[0].title == "Evan Morris"
    assert docs[0].text.startswith("Evan Morris Evan L. Morris (January 26, 1977")
    assert [doc_contents(d) for d in docs] == [r["contents"] for r in rows]


def test_format_docs_is_search_r1_rendering():
    docs = [
        Doc("1", "Paris", "Paris is the capital of France.", 2.0),
        Doc("2", "", "Untitled passage.", 1.0),
    ]
    expected = (
        'Doc 1(Title: "Paris") Paris is the capital of France.\nDoc 2(Title: Untitled passage.) \n'
    )
    assert format_docs(docs) == expected
    assert format_docs(docs) == search_r1_passages2string([doc_contents(d) for d in docs])
    assert format_docs([]) == ""


def test_format_docs_on_real_corpus_matches_search_r1():
    docs = read_corpus(DATA / "wiki18_sample_corpus.jsonl")[:3]
    rendered = format_docs(docs)
    assert rendered == search_r1_passages2string([doc_contents(d) for d in docs])
    assert rendered.startswith('Doc 1(Title: "Evan Morris") Evan Morris Evan L.')


def test_read_corpus_title_text_rows_and_int_ids(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(
        '{"id": 5, "title": "T", "text": "body"}\n\n{"id": "b", "contents": "\\"U\\"\\nmore"}\n'
    )
    assert read_corpus(path) == [Doc("5", "T", "body", 0.0), Doc("b", "U", "more", 0.0)]


def test_a_corpus_with_a_byte_order_mark_is_read_and_a_bad_byte_names_its_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"id": "a", "contents": "\\"T\\"\\nx"}\n')
    assert read_corpus(path) == [Doc("a", "T", "x", 0.0)]
    path.write_bytes(b'{"id": "a", "contents": "x"}\n{"id": "b", "contents": "caf\xe9"}\n')
    with pytest.raises(CorpusError) as err:
        read_corpus(path)
    assert str(err.value) == f"{path}:2: not UTF-8 text (line 2, byte 29 of the line is 0xe9)"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"c\.jsonl:2: invalid JSON"),
        ("[1, 2]", r"c\.jsonl:2: expected a JSON object, got list"),
        ('{"contents": "x"}', r"c\.jsonl:2: missing field 'id'"),
        ('{"id": "a"}', r"c\.jsonl:2: missing field 'contents'"),
        ('{"id": "a", "contents": 3}', r"c\.jsonl:2: field 'contents' must be a string, got int"),
        ('{"id": "a", "title": "t"}', r"c\.jsonl:2: missing field 'text'"),
        ('{"id": ["a"], "contents": "x"}', r"c\.jsonl:2: field 'id' must be a string, got list"),
        ('{"id": "a", "title": "t\\nu", "text": "x"}', r"c\.jsonl:2: field 'title' .*newline"),
    ],
)
def test_read_corpus_bad_row_names_file_line_field(tmp_path, line, message):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "ok", "contents": "fine"}\n' + line + "\n")
    with pytest.raises(CorpusError, match=message):
        read_corpus(path)
