"""BM25 over a passage corpus, a thin layer on `bm25s`.

Score of doc d for query q (bm25s's default "lucene" variant, k1=1.5, b=0.75):

    score(q, d) = sum_{t in q} IDF(t) * tf(t, d) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl)),
    IDF(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5)).

Tokenisation is `bm25s.tokenize`'s: lowercase, words of two or more word characters,
English stopwords removed, no stemming by default (a Snowball stemmer by language name,
e.g. "english", needs the optional PyStemmer package). A doc is indexed as its Search-R1
`contents` (title line + text). Like Lucene (Search-R1's BM25), a doc that shares no term
with the query is not returned, so a query may get fewer than k docs; the docs returned
rank exactly as raw bm25s ranks them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# bm25s imports JAX when it is installed (for its top-k), and JAX takes 75% of every GPU's
# memory the moment it starts: 105 of an H200's 139 GiB, measured, before the policy or vLLM
# load. Its top-k runs on the CPU here; a user who wants JAX on the GPU sets JAX_PLATFORMS.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import bm25s  # noqa: E402
from bm25s.stopwords import STOPWORDS_EN  # noqa: E402

from common.retrieval.base import Doc, doc_contents, read_corpus  # noqa: E402
from common.retrieval.doc_store import DocStore, gc_paused, read_config, write_config

STOPWORDS = "en"
# bm25s.tokenize's default is scikit-learn's r"(?u)\b\w\w+\b". Scanning left to right, a
# greedy \w\w+ can only start at the start of a run of word characters and takes the whole
# run, so the word boundaries never change a match; without them the scan is 30% faster.
TOKEN_PATTERN = r"\w\w+"

Stem = Callable[[list[str]], list[str]]


def load_stemmer(language: str | None) -> Stem | None:
    """PyStemmer's `stemWords` for `language`, or None for no stemming."""
    if language is None:
        return None
    try:
        import Stemmer
    except ImportError:
        raise ImportError(
            f"stemmer={language!r} needs PyStemmer: `pip install PyStemmer` (or use stemmer=None)"
        ) from None
    return Stemmer.Stemmer(language).stemWords


class QueryTokenizer:
    """Queries to the index's token ids, exactly as `bm25s.tokenize` + `BM25.retrieve` map them.

    Lowercase, `TOKEN_PATTERN` words, English stopwords dropped, then the stemmer, repeated
    words kept; words the index has never seen are dropped (they score nothing). Mapping
    straight to the index vocabulary skips the per-call vocabulary `bm25s.tokenize` builds
    (and the stopword set it rebuilds for every text): half the time of a numba search.
    """

    def __init__(self, vocab: dict[str, int], stem: Stem | None = None):
        self.vocab = vocab
        self.stem = stem
        self._split = re.compile(TOKEN_PATTERN).findall
        self._stopwords = frozenset(STOPWORDS_EN)
        # Without a stemmer a word maps straight to its id: stopwords are never in the index's
        # vocabulary, so one lookup drops both them and the unseen words.
        self._ids = {w: i for w, i in vocab.items() if w not in self._stopwords}

    def words(self, query: str) -> list[str]:
        """The query's index words (before the vocabulary lookup)."""
        words = [w for w in self._split(query.lower()) if w not in self._stopwords]
        return self.stem(words) if self.stem is not None and words else words

    def __call__(self, queries: list[str]) -> list[list[int]]:
        if self.stem is not None:
            vocab, words = self.vocab, self.words
            return [[vocab[w] for w in words(q) if w in vocab] for q in queries]
        ids, split = self._ids, self._split
        return [[ids[w] for w in split(q.lower()) if w in ids] for q in queries]


class BM25Retriever:
    """BM25 retrieval of full passages; implements the `Retriever` protocol.

    `backend="auto"` uses bm25s's numba kernels when numba is installed (about 10x faster
    than numpy; the first search in a process compiles them, a few seconds), numpy otherwise.
    `n_threads` is bm25s's: 0 searches the batch serially in the calling thread (numba's
    kernel without the GIL), so several threads may search at once; -1 uses every core
    for one batch (not safe from several threads at once with numba).
    """

    def __init__(
        self, model: bm25s.BM25, docs: DocStore, stemmer: str | None = None, n_threads: int = 0
    ):
        if model.scores["num_docs"] != len(docs):
            raise ValueError(f"index has {model.scores['num_docs']} docs, store {len(docs)}")
        self.model = model
        self.docs = docs
        self.stemmer = stemmer
        self.n_threads = n_threads
        self.tokenize = QueryTokenizer(model.vocab_dict, load_stemmer(stemmer))

    def __len__(self) -> int:
        return len(self.docs)

    @classmethod
    def from_docs(
        cls,
        docs: Sequence[Doc],
        *,
        k1: float = 1.5,
        b: float = 0.75,
        method: str = "lucene",
        stemmer: str | None = None,
        backend: str = "auto",
        n_threads: int = 0,
        show_progress: bool = False,
    ) -> BM25Retriever:
        """Index `docs` in memory."""
        if not docs:
            raise ValueError("cannot build a BM25 index over an empty corpus")
        tokens = bm25s.tokenize(
            [doc_contents(d) for d in docs],
            stopwords=STOPWORDS,
            stemmer=load_stemmer(stemmer),
            show_progress=show_progress,
        )
        if not tokens.vocab:
            raise ValueError(f"none of the {len(docs)} docs has a word to index")
        model = bm25s.BM25(k1=k1, b=b, method=method, backend=backend)
        model.index(tokens, show_progress=show_progress)
        return cls(model, DocStore(docs), stemmer=stemmer, n_threads=n_threads)

    @classmethod
    def from_corpus(cls, path: str | Path, **kwargs: Any) -> BM25Retriever:
        """Index a jsonl corpus file (see `read_corpus`); kwargs as for `from_docs`."""
        return cls.from_docs(read_corpus(path), **kwargs)

    def save(self, folder: str | Path) -> None:
        """Write the index, the passage texts and the tokenisation settings into `folder`."""
        folder = Path(folder)
        self.model.save(folder, show_progress=False)
        self.docs.save(folder)
        write_config(folder, {"kind": "bm25", "stopwords": STOPWORDS, "stemmer": self.stemmer})

    @classmethod
    def load(
        cls, folder: str | Path, mmap: bool = True, backend: str = "auto", n_threads: int = 0
    ) -> BM25Retriever:
        """Open a saved index; `mmap=True` maps the score arrays and texts instead of reading them."""
        config = read_config(folder, "bm25")
        model = bm25s.BM25.load(folder, mmap=mmap, load_corpus=False, backend=backend)
        docs = DocStore.load(folder, mmap=mmap)
        return cls(model, docs, stemmer=config["stemmer"], n_threads=n_threads)

    def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        """Top-k docs per query, best first, only docs with a positive score.

        k above the corpus size is clamped. All queries go to bm25s in one call.
        """
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        if not queries:
            return []
        with gc_paused():  # the per-query lists would wake the collector every 700
            tokens = self.tokenize(queries)
        # A query left without indexed words matches nothing; bm25s also rejects a batch
        # whose first query is empty, so those never reach it.
        asked = [i for i, t in enumerate(tokens) if t]
        results: list[list[Doc]] = [[] for _ in queries]
        if not asked:
            return results
        ids, scores = self.model.retrieve(
            [tokens[i] for i in asked],
            k=min(k, len(self)),
            show_progress=False,
            n_threads=self.n_threads,
        )
        rows = self.docs.take(ids.tolist(), scores.tolist(), positive=True)
        if len(asked) == len(queries):
            return rows
        for i, row in zip(asked, rows, strict=True):
            results[i] = row
        return results
