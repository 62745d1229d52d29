"""The evidence oracle: hand-made cases, and the tiny world searched with real BM25."""

from __future__ import annotations

import pytest

from common.retrieval.base import Doc
from common.retrieval.bm25 import BM25Retriever
from common.tinyworld import SplitSizes, documents, generate_world, make_questions
from eviback.oracle import EvidenceOracle
from eviback.prompts import Round
from eviback.teacher import TeacherItem, Verdict, parse_verdict

FILM = Doc("film-1", "Lanterns", "Lanterns is a film directed by Ora Velk.", 2.0)
PERSON = Doc("person-1", "Ora Velk", "Ora Velk was born in Tamsford.", 1.0)
OTHER = Doc("city-9", "Zuro", "Zuro is a city.", 0.5)
IDS = {"supporting_ids": ["film-1", "person-1"]}


def item(rounds, metadata=IDS, refs=("Tamsford", "Tamsford town")):
    return TeacherItem("Where was the director of Lanterns born?", rounds, list(refs), metadata)


def test_all_supporting_ids_retrieved_across_rounds_is_s_with_first_gold():
    v = EvidenceOracle().label(
        item([Round("Lanterns", [FILM, OTHER]), Round("Ora Velk", [PERSON])])
    )
    assert v == Verdict(True, "S", "Tamsford", "all 2 supporting documents were retrieved")


def test_a_missing_supporting_doc_is_i_and_named():
    v = EvidenceOracle().label(item([Round("Lanterns", [FILM, OTHER])]))
    assert (v.valid, v.status, v.answer) == (True, "I", "")
    assert "person-1" in v.reason and "film-1" not in v.reason


def test_only_the_top_m_documents_count():
    rounds = [Round("Lanterns", [FILM, OTHER, PERSON])]
    assert EvidenceOracle(top_m=3).label(item(rounds)).status == "S"
    assert EvidenceOracle(top_m=2).label(item(rounds)).status == "I"


def test_titles_match_case_insensitively_when_there_are_no_ids():
    meta = {"supporting_titles": ["lanterns", "ORA VELK "]}
    rounds = [Round("q", [FILM, PERSON])]
    assert EvidenceOracle().label(item(rounds, meta)).status == "S"
    assert EvidenceOracle().label(item([Round("q", [FILM])], meta)).status == "I"


def test_no_search_is_insufficient():
    assert EvidenceOracle().label(item([])).status == "I"


def test_missing_metadata_or_gold_is_a_clear_error():
    with pytest.raises(ValueError, match="supporting_ids.*supporting_titles"):
        EvidenceOracle().label(item([], {}))
    with pytest.raises(ValueError, match="no gold answers"):
        EvidenceOracle().label(item([], IDS, refs=()))
    with pytest.raises(ValueError, match="top_m"):
        EvidenceOracle(top_m=0)


def test_text_form_parses_to_the_same_verdict():
    oracle = EvidenceOracle()
    for rounds in ([Round("a", [FILM, PERSON])], [Round("a", [FILM])]):
        assert parse_verdict(oracle.label_text(item(rounds))) == oracle.label(item(rounds))


def test_judge_interface_counts_verdicts():
    judgements, stats = EvidenceOracle().judge(
        [item([Round("a", [FILM, PERSON])]), item([Round("a", [FILM])]), item([])]
    )
    assert [j.final.status for j in judgements] == ["S", "I", "I"]
    assert all(j.stage_a == j.final and j.stage_b is None for j in judgements)
    assert (stats.items, stats.supported, stats.insufficient, stats.calls) == (3, 1, 2, 0)


@pytest.fixture(scope="module")
def tiny():
    world = generate_world(0)
    questions = make_questions(world, 0, SplitSizes(train=40, dev=5, test=5))["train"]
    docs = [Doc(d.id, d.title, d.text, 0.0) for d in documents(world)]
    return questions, BM25Retriever.from_docs(docs, backend="numpy")


def test_tiny_world_gold_search_path_is_s_and_a_cut_path_is_i(tiny):
    questions, retriever = tiny
    oracle = EvidenceOracle(top_m=5)
    multi_hop = [q for q in questions if len(set(q.supporting_ids)) >= 2]
    assert len(multi_hop) >= 5
    for q in multi_hop:
        results = retriever.search(list(q.gold_queries), 5)
        rounds = [Round(query, docs) for query, docs in zip(q.gold_queries, results, strict=True)]
        meta = q.to_flashrag()["metadata"]
        full = oracle.label(TeacherItem(q.question, rounds, list(q.golden_answers), meta))
        assert (full.status, full.answer) == ("S", q.golden_answers[0]), q
        cut = [r for r in rounds if q.supporting_ids[-1] not in {d.id for d in r.docs}]
        v = oracle.label(TeacherItem(q.question, cut, list(q.golden_answers), meta))
        assert v.status == "I" and q.supporting_ids[-1] in v.reason
