"""Retrieval restricted to one question's own paragraphs (HotpotQA distractor setting).

Each question carries its candidate paragraphs (10 in HotpotQA's distractor setting: the
2 gold ones and 8 distractors), as `metadata["paragraphs"] = [{"title", "text"}, ...]`.
A query ranks only those, with BM25 fitted on that small set (IDF over the question's own
paragraphs); the fitted index is cached per question.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence

from common.retrieval.base import Doc
from common.retrieval.bm25 import BM25Retriever

Paragraphs = Sequence[Mapping[str, str]]


def paragraph_docs(paragraphs: Paragraphs, where: str) -> list[Doc]:
    """Docs of a question's paragraphs; a doc's id is the paragraph's position ("0".."9")."""
    if not paragraphs:
        raise ValueError(f"{where}: no paragraphs")
    docs = []
    for i, p in enumerate(paragraphs):
        for field in ("title", "text"):
            value = p.get(field) if isinstance(p, Mapping) else None
            if not isinstance(value, str):
                raise ValueError(f"{where}: paragraph {i}: field {field!r} must be a string")
        docs.append(Doc(str(i), p["title"], p["text"], 0.0))
    return docs


class PerQuestionRetriever:
    """BM25 over each question's own paragraphs, with an LRU cache of fitted indexes."""

    def __init__(self, paragraphs: Mapping[str, Paragraphs] | None = None, cache_size: int = 4096):
        self._paragraphs: dict[str, Paragraphs] = dict(paragraphs or {})
        self._cache: OrderedDict[Hashable, BM25Retriever] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def add(self, question_id: str, paragraphs: Paragraphs) -> None:
        """Register a question's paragraphs so `search_for` can take its id."""
        self._paragraphs[question_id] = paragraphs
        with self._lock:
            self._cache.pop(question_id, None)

    def search_for(self, question: str | Paragraphs, queries: list[str], k: int) -> list[list[Doc]]:
        """Top-k of the question's paragraphs per query; `question` is a registered id or
        the paragraph list itself."""
        return self._retriever(question).search(queries, k)

    def _retriever(self, question: str | Paragraphs) -> BM25Retriever:
        if isinstance(question, str):
            if question not in self._paragraphs:
                raise KeyError(f"question {question!r} has no registered paragraphs")
            key: Hashable = question
        else:
            key = tuple((d.title, d.text) for d in paragraph_docs(question, "paragraphs"))
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        if isinstance(question, str):
            docs = paragraph_docs(self._paragraphs[question], f"question {question!r}")
        else:
            docs = [Doc(str(i), title, text, 0.0) for i, (title, text) in enumerate(key)]
        # numpy backend: ten paragraphs are scored faster than numba's kernels start up.
        retriever = BM25Retriever.from_docs(docs, backend="numpy")
        with self._lock:
            self._cache[key] = retriever
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return retriever
