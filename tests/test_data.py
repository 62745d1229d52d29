import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.data import DataError, QAExample, load_qa, load_qa_mix, write_qa_jsonl

QA = Path(__file__).parent / "data" / "qa"


def test_hotpotqa_original_rows() -> None:
    examples = load_qa(QA / "hotpotqa_sample.jsonl")
    assert len(examples) == 3
    ex = examples[0]
    assert ex.id == "hotpotqa_sample:5ae143ed55429920d5234360"
    assert ex.question.startswith("In what year was the university where Sergei")
    assert ex.golden_answers == ["1755"]
    meta = ex.metadata
    assert meta["type"] == "bridge" and meta["level"] == "hard"
    assert meta["supporting_titles"] == ["Sergei Aleksandrovich Tokarev", "Moscow State University"]
    assert meta["supporting_facts"] == [
        ["Sergei Aleksandrovich Tokarev", 0],
        ["Moscow State University", 3],
    ]
    assert len(meta["paragraphs"]) == 10
    msu = meta["paragraphs"][0]
    assert msu["title"] == "Moscow State University"
    assert len(msu["sentences"]) == 8
    assert msu["sentences"][3] == " It was founded on January 25, 1755 by Mikhail Lomonosov."
    # HotpotQA sentences carry their own leading space: joined as they are
    assert msu["text"] == "".join(msu["sentences"])
    assert "имени М. В. Ломоносова , often" in msu["text"]
    assert set(meta) == {"paragraphs", "supporting_titles", "supporting_facts", "type", "level"}


def test_hotpotqa_json_list_equals_jsonl() -> None:
    as_list = load_qa(QA / "hotpotqa_sample.json", source="h")
    assert as_list == load_qa(QA / "hotpotqa_sample.jsonl", source="h")
    assert load_qa(QA / "hotpotqa_sample.json", format="hotpotqa", source="h") == as_list


def test_hotpotqa_hub_columnar_rows(tmp_path: Path) -> None:
    """The hub's hotpot_qa stores context and supporting facts column-wise, and names the id `id`."""
    rows = [json.loads(line) for line in (QA / "hotpotqa_sample.jsonl").read_text().splitlines()]
    for row in rows:
        row["id"] = row.pop("_id")
        row["context"] = {
            "title": [t for t, _ in row["context"]],
            "sentences": [s for _, s in row["context"]],
        }
        row["supporting_facts"] = {
            "title": [t for t, _ in row["supporting_facts"]],
            "sent_id": [i for _, i in row["supporting_facts"]],
        }
    path = tmp_path / "hub.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert load_qa(path, source="h") == load_qa(QA / "hotpotqa_sample.jsonl", source="h")


def test_2wiki_original_rows() -> None:
    examples = load_qa(QA / "2wiki_original_handmade.json")
    assert [e.id for e in examples] == [
        "2wiki_original_handmade:hm2w_0001",
        "2wiki_original_handmade:hm2w_0002",
    ]
    ex = examples[0]
    assert ex.golden_answers == ["Ilse Kovalenko"]
    assert ex.metadata["type"] == "compositional"
    assert ex.metadata["evidences"][1] == ["Mira Kovalenko", "mother", "Ilse Kovalenko"]
    assert ex.metadata["supporting_titles"] == ["The Glass Orchard", "Mira Kovalenko"]
    # 2Wiki sentences have no leading space: joined with one
    assert ex.metadata["paragraphs"][0]["text"] == (
        "The Glass Orchard is a 1962 drama film. It was directed by Mira Kovalenko."
    )
    assert examples[1].golden_answers == ["no"]
    assert load_qa(QA / "2wiki_original_handmade.json", format="2wiki") == examples


def test_musique_rows() -> None:
    first, second = load_qa(QA / "musique_handmade.jsonl")
    assert first.id == "musique_handmade:2hop__hm_1"
    assert first.golden_answers == [
        "Ruritania",
        "Kingdom of Ruritania",
    ]  # answer + aliases, deduped
    assert first.metadata["supporting_titles"] == ["The Glass Orchard", "Mira Kovalenko"]
    assert first.metadata["paragraphs"][2] == {
        "title": "Mira Kovalenko",
        "text": "Mira Kovalenko was born in Ruritania in 1921.",
        "idx": 2,
        "is_supporting": True,
    }
    assert first.metadata["answerable"] is True
    assert first.metadata["question_decomposition"][1]["answer"] == "Ruritania"
    assert second.golden_answers == ["7"]


@pytest.mark.parametrize(
    ("name", "ids", "golds"),
    [
        ("2wiki_simple_sample", ["1", "2", "3"], ["Tetisheri"]),
        (
            "musique_simple_sample",
            ["1", "2", "3"],
            ["Academy Award for Best Live Action Short Film"],
        ),
        ("bamboogle_sample", ["1", "2", "3"], ["james madison"]),
    ],
)
def test_simple_rows(name: str, ids: list[str], golds: list[str]) -> None:
    examples = load_qa(QA / f"{name}.jsonl")
    assert [e.id for e in examples] == [f"{name}:{i}" for i in ids]
    assert examples[0].golden_answers == golds
    assert examples[0].metadata == {"gen_text_store": ""}


def test_flashrag_rows_and_golds_normalised() -> None:
    examples = load_qa(QA / "flashrag_handmade.jsonl", source="nq")
    assert [e.id for e in examples] == ["nq:test_0", "nq:test_1", "nq:test_2"]
    assert examples[0].golden_answers == ["Mira Kovalenko", "M. Kovalenko"]
    assert examples[0].metadata == {"split": "test"}
    assert examples[1].golden_answers == ["1958"]
    assert examples[2].golden_answers == ["7", "seven"]
    assert examples[2].metadata == {}


def test_missing_ids_become_row_index(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text(
        '{"question": "a?", "answer": "x"}\n\n{"question": "b?", "answer": ["y", "z"]}\n'
    )
    examples = load_qa(path)
    assert [e.id for e in examples] == ["q:0", "q:1"]
    assert examples[1].golden_answers == ["y", "z"]
    assert [e.id for e in load_qa(path, source="")] == ["0", "1"]


def test_write_round_trip_of_every_sample(tmp_path: Path) -> None:
    examples = load_qa_mix(sorted(QA.iterdir()))
    assert len(examples) == 3 * 5 + 2 + 2 + 3  # five copied 3-row files (hotpotqa twice), hand-made
    write_qa_jsonl(examples, tmp_path / "out" / "all.jsonl")
    assert load_qa(tmp_path / "out" / "all.jsonl", source="") == examples
    assert load_qa(tmp_path / "out" / "all.jsonl", format="flashrag", source="") == examples


texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
nonblank = texts.filter(lambda s: s.strip() != "")
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)


@given(
    st.lists(
        st.builds(
            QAExample,
            id=texts,
            question=nonblank,
            golden_answers=st.lists(nonblank, min_size=1, max_size=3),
            metadata=st.dictionaries(texts, json_values, max_size=3),
        ),
        min_size=1,
        max_size=4,
        unique_by=lambda e: e.id,
    )
)
def test_write_round_trip_property(tmp_path_factory, examples: list[QAExample]) -> None:
    path = tmp_path_factory.getbasetemp() / "round_trip.jsonl"
    write_qa_jsonl(examples, path)
    assert load_qa(path, source="") == examples


def test_mix_keeps_same_stems_apart(tmp_path: Path) -> None:
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "dev.jsonl").write_text('{"idx": 1, "question": "q?", "answer": "x"}\n')
    examples = load_qa_mix([tmp_path / "a" / "dev.jsonl", tmp_path / "b" / "dev.jsonl"])
    assert [e.id for e in examples] == [f"{tmp_path / d / 'dev.jsonl'}:1" for d in ("a", "b")]
    mixed = load_qa_mix([QA / "bamboogle_sample.jsonl", tmp_path / "a" / "dev.jsonl"])
    assert [e.id for e in mixed][-2:] == ["bamboogle_sample:3", "dev:1"]


def test_mix_same_file_twice_is_an_error() -> None:
    path = QA / "bamboogle_sample.jsonl"
    with pytest.raises(DataError, match="duplicate example id"):
        load_qa_mix([path, path])


@pytest.mark.parametrize(
    ("text", "where", "field"),
    [
        (
            '{"question": "q", "answer": "a"}\n{"question": "q", "answer": }\n',
            "line 2",
            "invalid JSON",
        ),
        (
            '{"idx": 1, "question": "q", "answer": "a"}\n{"idx": 2, "answer": "a"}\n',
            "line 2",
            "field 'question': missing (simple format)",
        ),
        (
            '{"idx": 1, "question": "q", "answer": "a"}\n\n{"idx": 2, "question": 5, "answer": "a"}\n',
            "line 3",
            "field 'question': expected str",
        ),
        ('{"idx": 1, "question": " ", "answer": "a"}\n', "line 1", "field 'question': is empty"),
        ('{"question": "q", "answer": {"text": "a"}}\n', "line 1", "field 'answer': expected"),
        ('{"question": "q", "answer": ["a", null]}\n', "line 1", "field 'answer[1]': bad answer"),
        ('{"question": "q", "answer": []}\n', "line 1", "field 'answer': no answers"),
        (
            '{"question": "q", "answer": "a"}\n[1, 2]\n',
            "line 2",
            "field '<row>': expected a JSON object",
        ),
        (
            '{"idx": 1, "question": "q", "answer": "a"}\n{"idx": 1, "question": "r", "answer": "b"}\n',
            "line 2",
            "duplicate id '1' (first at line 1)",
        ),
        (
            '{"id": "x", "question": "q", "golden_answers": "a", "metadata": [1]}\n',
            "line 1",
            "field 'metadata': expected dict",
        ),
        (
            '{"_id": "x", "question": "q", "answer": "a", "context": [["T", ["s"]], ["U", "s"]], "supporting_facts": []}\n',
            "line 1",
            "field 'context[1]': expected [str, list]",
        ),
        (
            '{"_id": "x", "question": "q", "answer": "a", "context": [["T", ["s", 3]]], "supporting_facts": []}\n',
            "line 1",
            "field 'context[0]': sentences must be strings",
        ),
        (
            '{"_id": "x", "question": "q", "answer": "a", "context": [], "supporting_facts": [["T", "0"]]}\n',
            "line 1",
            "field 'supporting_facts[0]': expected [str, int]",
        ),
        (
            '{"_id": "x", "question": "q", "answer": "a", "context": {"title": ["T"]}, "supporting_facts": []}\n',
            "line 1",
            "field 'context': expected lists 'title' and 'sentences'",
        ),
        (
            '{"_id": "x", "question": "q", "answer": "a", "context": [], "supporting_facts": [], "evidences": [["a", "b"]]}\n',
            "line 1",
            "field 'evidences[0]': expected [subject, relation, object]",
        ),
        (
            '{"id": "x", "question": "q", "answer": "a", "paragraphs": [{"idx": 0, "paragraph_text": "t"}]}\n',
            "line 1",
            "field 'paragraphs[0].title': missing",
        ),
        (
            '{"id": "x", "question": "q", "answer": "a", "paragraphs": [{"idx": 0, "title": "T", "paragraph_text": "t", "is_supporting": "yes"}]}\n',
            "line 1",
            "field 'paragraphs[0].is_supporting': expected bool",
        ),
        (
            '{"question": "q", "text": "a"}\n',
            "line 1",
            "cannot tell the QA format from the keys ['question', 'text']",
        ),
        ("", "", "no rows (the file is empty)"),
        ("\n  \n", "", "no rows (the file is empty)"),
        (
            '[{"question": "q", "answer": "a"},\n {"question": "r", "answer": "b"},\n {"question": "s", answer: "c"}]',
            "line 3",
            "invalid JSON",
        ),
        (
            '[{"question": "q", "answer": "a"},\n {"question": "r", "answer": 1.5e400\n, "x": [}]',
            "line 3",
            "invalid JSON",
        ),
        (
            '[{"question": "q", "answer": "a"}\n\n {"question": "r", "answer": "b"}]',
            "line 3",
            "expected ',' or ']'",
        ),
        ('[{"question": "q", "answer": "a"}] x', "", "extra data after the closing ']'"),
        (
            '[\n{"question": "q", "answer": "a"},\n\n 7]',
            "line 4",
            "field '<row>': expected a JSON object",
        ),
    ],
)
def test_bad_rows_name_file_line_and_field(
    tmp_path: Path, text: str, where: str, field: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(DataError) as e:
        load_qa(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}, {where}:" if where else f"{path}:")
    assert field in msg


def test_explicit_format_that_does_not_fit() -> None:
    with pytest.raises(DataError) as e:
        load_qa(QA / "musique_handmade.jsonl", format="hotpotqa")
    assert "line 1: field 'context': missing (hotpotqa format)" in str(e.value)
    with pytest.raises(DataError, match="unknown QA format 'squad'"):
        load_qa(QA / "musique_handmade.jsonl", format="squad")


def test_missing_file_and_bad_hub_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot read QA file"):
        load_qa(tmp_path / "none.jsonl")
    with pytest.raises(DataError, match=r"hf://owner/name\[:config\]@split"):
        load_qa("hf://hotpotqa/hotpot_qa")


def test_hub_offline_is_a_clear_error(tmp_path: Path) -> None:
    # a fresh process: the hub libraries read the offline switches when first imported
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(tmp_path),
    }
    code = (
        "from common.data import DataError, load_qa\n"
        "try:\n    load_qa('hf://hotpotqa/hotpot_qa:distractor@validation')\n"
        "except DataError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[1],
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("cannot load hf://hotpotqa/hotpot_qa:distractor@validation")
    assert "HF_DATASETS_OFFLINE" in out.stdout and "Traceback" not in out.stdout + out.stderr
