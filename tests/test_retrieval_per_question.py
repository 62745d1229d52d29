"""PerQuestionRetriever: ranks only a question's own paragraphs (HotpotQA distractor)."""

import json
from pathlib import Path

import pytest

from common.retrieval import PerQuestionRetriever

DATA = Path(__file__).parent / "data" / "retrieval"


@pytest.fixture(scope="module")
def questions() -> list[dict]:
    """The 20 sample questions, paragraphs as load_qa stores them: [{"title", "text"}]."""
    out = []
    for line in (DATA / "hotpotqa_sample.jsonl").open():
        row = json.loads(line)
        paragraphs = [{"title": t, "text": "".join(s)} for t, s in row["context"]]
        gold = {title for title, _ in row["supporting_facts"]}
        out.append(
            {"id": row["_id"], "question": row["question"], "paragraphs": paragraphs, "gold": gold}
        )
    return out


def test_ranks_only_the_question_s_own_paragraphs(questions):
    first, second = questions[0], questions[1]  # Tokarev's university; Black Book's actress
    retriever = PerQuestionRetriever({q["id"]: q["paragraphs"] for q in questions})
    own_titles = [p["title"] for p in first["paragraphs"]]
    [docs] = retriever.search_for(first["id"], ["Tokarev professor"], 10)
    assert docs[0].title == "Sergei Aleksandrovich Tokarev"
    assert docs[0].id == str(own_titles.index("Sergei Aleksandrovich Tokarev")) == "8"
    assert docs[0].text == first["paragraphs"][8]["text"]
    # Halina Reijn is the other question's paragraph: this question's search never sees it.
    [docs] = retriever.search_for(first["id"], ["Halina Reijn Dutch actress university"], 10)
    assert docs and all(d.title in own_titles for d in docs)
    [docs] = retriever.search_for(second["id"], ["Halina Reijn Dutch actress university"], 10)
    assert docs[0].title == "Halina Reijn"


def test_supporting_paragraphs_rank_high_for_their_question(questions):
    retriever = PerQuestionRetriever()
    some = both = 0
    for q in questions:
        [docs] = retriever.search_for(q["paragraphs"], [q["question"]], 5)
        some += bool(q["gold"] & {d.title for d in docs})
        both += q["gold"] <= {d.title for d in docs}
    # Measured once; far above chance (5 of 10 paragraphs: both gold in top 5 ~22%).
    assert (some, both) == (19, 13)


def test_ids_and_paragraph_lists_agree_and_are_cached(questions):
    q = questions[3]
    retriever = PerQuestionRetriever()
    retriever.add(q["id"], q["paragraphs"])
    queries = [q["question"], "nothing_matches_this"]
    by_id = retriever.search_for(q["id"], queries, 3)
    assert by_id == retriever.search_for(q["paragraphs"], queries, 3)
    assert by_id[1] == []
    assert retriever._retriever(q["id"]) is retriever._retriever(q["id"])


def test_cache_is_bounded(questions):
    retriever = PerQuestionRetriever(cache_size=2)
    for q in questions[:5]:
        retriever.search_for(q["paragraphs"], ["film"], 1)
    assert len(retriever._cache) == 2


def test_bad_input_is_named(questions):
    retriever = PerQuestionRetriever()
    with pytest.raises(KeyError, match="'nope' has no registered paragraphs"):
        retriever.search_for("nope", ["q"], 3)
    with pytest.raises(ValueError, match="paragraphs: paragraph 1: field 'text' must be a string"):
        retriever.search_for([{"title": "A", "text": "x"}, {"title": "B"}], ["q"], 3)
    with pytest.raises(ValueError, match="no paragraphs"):
        retriever.search_for([], ["q"], 3)
