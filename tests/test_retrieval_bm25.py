"""BM25Retriever: hand-computed scores, equality with raw bm25s, save/load."""

import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bm25s
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.retrieval import BM25Retriever, Doc, doc_contents
from common.retrieval.bm25 import QueryTokenizer, load_stemmer

DATA = Path(__file__).parent / "data" / "retrieval"

CITIES = [
    Doc("a", "Paris", "Paris is the capital of France.", 0.0),
    Doc("b", "Berlin", "Berlin is the capital of Germany.", 0.0),
    Doc("c", "Rome", "Rome is in Italy.", 0.0),
]


def hotpot_docs() -> list[Doc]:
    """Every context paragraph of the 20 sample questions, deduplicated by title."""
    docs: dict[str, Doc] = {}
    for line in (DATA / "hotpotqa_sample.jsonl").open():
        for title, sentences in json.loads(line)["context"]:
            docs.setdefault(title, Doc(str(len(docs)), title, "".join(sentences), 0.0))
    return list(docs.values())


@pytest.fixture(scope="module")
def hotpot() -> tuple[list[Doc], list[str]]:
    questions = [json.loads(line)["question"] for line in (DATA / "hotpotqa_sample.jsonl").open()]
    return hotpot_docs(), questions


def test_scores_match_hand_computed_bm25():
    # Tokens: a = paris paris capital france; b = berlin berlin capital germany;
    # c = rome rome italy ("is", "the", "of", "in" are stopwords). N = 3, avgdl = 11/3.
    [[top, second]] = BM25Retriever.from_docs(CITIES).search(["capital of Germany"], 10)
    norm = 1.5 * (1 - 0.75 + 0.75 * 4 / (11 / 3))  # k1 * (1 - b + b * |d| / avgdl), |d| = 4
    idf_capital = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))
    idf_germany = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))
    tf_part = 1 / (1 + norm)
    assert (top.id, second.id) == ("b", "a")  # Rome shares no term: not returned
    assert top.score == pytest.approx((idf_capital + idf_germany) * tf_part, rel=1e-6)
    assert second.score == pytest.approx(idf_capital * tf_part, rel=1e-6)
    assert top == Doc("b", "Berlin", "Berlin is the capital of Germany.", top.score)


def test_unique_match_ranks_first_and_k_is_clamped():
    retriever = BM25Retriever.from_docs(CITIES)
    assert [[d.id for d in r] for r in retriever.search(["Italy", "France Paris"], 50)] == [
        ["c"],
        ["a"],
    ]
    assert len(retriever.search(["capital"], 1)[0]) == 1
    with pytest.raises(ValueError, match="k must be at least 1"):
        retriever.search(["capital"], 0)


def test_queries_without_indexed_terms_get_no_docs():
    # bm25s's numba path rejects a batch whose first query is empty; the wrapper must not.
    retriever = BM25Retriever.from_docs(CITIES)
    results = retriever.search(["the of", "", "zzz unknown", "Rome"], 3)
    assert [[d.id for d in r] for r in results] == [[], [], [], ["c"]]
    assert retriever.search([], 3) == []


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_ranking_equals_raw_bm25s(hotpot, backend):
    docs, questions = hotpot
    queries = [*questions, "Which magazine was started first?", "Scott Derrickson"]
    ours = BM25Retriever.from_docs(docs, backend=backend).search(queries, 10)

    raw = bm25s.BM25(backend=backend)
    raw.index(bm25s.tokenize([doc_contents(d) for d in docs], stopwords="en"))
    ids, scores = raw.retrieve(bm25s.tokenize(queries, stopwords="en"), k=10)
    for got, raw_ids, raw_scores in zip(ours, ids.tolist(), scores.tolist(), strict=True):
        expected = [(docs[i].id, s) for i, s in zip(raw_ids, raw_scores, strict=True) if s > 0]
        assert [(d.id, d.score) for d in got] == expected
    assert all(got for got in ours)


words = st.sampled_from(["paris", "The", "of", "capital", "café", "x", "ab", "Ünïcode", "42"])
texts = st.lists(st.one_of(words, st.text(max_size=6)), max_size=12).map(" ".join)


@settings(max_examples=40)
@given(corpus=st.lists(texts, min_size=1, max_size=6), queries=st.lists(texts, max_size=5))
def test_any_corpus_and_queries_rank_as_raw_bm25s(corpus, queries):
    docs = [Doc(str(i), "", text, 0.0) for i, text in enumerate(corpus)]
    if not bm25s.tokenize(corpus, stopwords="en", show_progress=False).vocab:
        with pytest.raises(ValueError, match="has a word to index"):
            BM25Retriever.from_docs(docs)
        return
    ours = BM25Retriever.from_docs(docs, backend="numpy").search(queries, 3)
    if not queries:
        assert ours == []
        return
    raw = bm25s.BM25(backend="numpy")
    raw.index(
        bm25s.tokenize([doc_contents(d) for d in docs], stopwords="en", show_progress=False),
        show_progress=False,
    )
    tokens = bm25s.tokenize(queries, stopwords="en", show_progress=False)
    ids, scores = raw.retrieve(tokens, k=min(3, len(docs)), show_progress=False)
    expected = [
        [(str(i), s) for i, s in zip(row, srow, strict=True) if s > 0]
        for row, srow in zip(ids.tolist(), scores.tolist(), strict=True)
    ]
    assert [[(d.id, d.score) for d in r] for r in ours] == expected


def bm25s_words(texts: list[str], stemmer=None) -> list[list[str]]:
    return bm25s.tokenize(
        texts, stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False
    )


@settings(max_examples=200)
@given(queries=st.lists(st.one_of(texts, st.text()), min_size=1, max_size=4))
def test_query_tokenizer_splits_as_bm25s_tokenize(queries):
    tokenizer = QueryTokenizer({})
    assert [tokenizer.words(q) for q in queries] == bm25s_words(queries)


def test_query_tokenizer_maps_to_index_ids_and_drops_unknown_words(hotpot):
    docs, questions = hotpot
    retriever = BM25Retriever.from_docs(docs)
    vocab = retriever.model.vocab_dict
    queries = [*questions, "zzqx Film film's", ""]
    expected = [[vocab[w] for w in ws if w in vocab] for ws in bm25s_words(queries)]
    assert retriever.tokenize(queries) == expected
    assert expected[-2] == [vocab["film"], vocab["film"]]  # unknown dropped, repeats kept
    assert expected[-1] == []


def test_query_tokenizer_stems_as_bm25s_tokenize():
    pytest.importorskip("Stemmer")
    stem = load_stemmer("english")
    queries = ["Capitals of running countries", "the studies studied"]
    assert [QueryTokenizer({}, stem).words(q) for q in queries] == bm25s_words(queries, stem)


@pytest.mark.parametrize("mmap", [True, False])
def test_save_load_round_trip(hotpot, tmp_path, mmap):
    docs, questions = hotpot
    built = BM25Retriever.from_docs(docs)
    built.save(tmp_path / "idx")
    loaded = BM25Retriever.load(tmp_path / "idx", mmap=mmap)
    assert len(loaded) == len(docs)
    assert loaded.search(questions, 5) == built.search(questions, 5)
    assert (
        loaded.search(["Scott Derrickson"], 1)[0][0] == built.search(["Scott Derrickson"], 1)[0][0]
    )


def test_from_search_r1_corpus_file():
    retriever = BM25Retriever.from_corpus(DATA / "wiki18_sample_corpus.jsonl")
    [[top, *_]] = retriever.search(["lobbyist for Genentech"], 3)
    assert (top.id, top.title) == ("0", "Evan Morris")


def test_load_rejects_other_folders(tmp_path):
    with pytest.raises(FileNotFoundError, match="retriever.json"):
        BM25Retriever.load(tmp_path)
    (tmp_path / "retriever.json").write_text('{"kind": "dense"}')
    with pytest.raises(ValueError, match="expected 'bm25'"):
        BM25Retriever.load(tmp_path)


def test_empty_corpus_is_an_error():
    with pytest.raises(ValueError, match="empty corpus"):
        BM25Retriever.from_docs([])


def test_stemmer_needs_pystemmer_or_stems():
    try:
        import Stemmer  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install PyStemmer"):
            load_stemmer("english")
    else:
        retriever = BM25Retriever.from_docs(CITIES, stemmer="english")
        assert retriever.search(["capitals"], 3)[0][0].id in {"a", "b"}


def test_concurrent_searches_from_threads(hotpot):
    """The server searches from its thread pool; numba's serial kernel must allow that."""
    docs, questions = hotpot
    retriever = BM25Retriever.from_docs(docs, backend="numba")
    batches = [questions[i : i + 5] for i in range(0, len(questions), 5)]
    expected = [retriever.search(b, 5) for b in batches]
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda b: retriever.search(b, 5), batches * 5)) == expected * 5


@pytest.mark.parametrize("preset", [None, "cuda"])
def test_bm25_keeps_jax_off_the_gpu_unless_the_user_says(preset):
    """bm25s imports JAX when it is installed, and JAX takes 75% of a GPU at start (105 of an
    H200's 139 GiB, measured on one before the fix): importing the retriever pins JAX to the
    CPU, and a JAX_PLATFORMS the user set is kept."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    if preset:
        env["JAX_PLATFORMS"] = preset
    code = "import os, common.retrieval.bm25; print(os.environ['JAX_PLATFORMS'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (preset or "cpu")
