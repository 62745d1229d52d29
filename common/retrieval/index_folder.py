"""Build and open index folders, whichever retriever they hold (see `doc_store`)."""

from __future__ import annotations

from pathlib import Path

from common.retrieval.base import CorpusRetriever, read_corpus
from common.retrieval.doc_store import CONFIG_FILE, read_config


def is_index_folder(folder: str | Path) -> bool:
    return (Path(folder) / CONFIG_FILE).is_file()


def load_index(
    folder: str | Path, mmap: bool = True, backend: str = "auto", faiss_gpu: str = "off"
) -> CorpusRetriever:
    """The retriever saved in `folder` (BM25 or dense), memory-mapped by default.

    `backend` is bm25s's for a BM25 folder ("auto", "numba" or "numpy"); `faiss_gpu` where a
    dense folder's index searches (`dense.place_index`: "auto", "on" or "off").
    """
    kind = read_config(folder).get("kind")
    if kind == "bm25":
        from common.retrieval.bm25 import BM25Retriever

        return BM25Retriever.load(folder, mmap=mmap, backend=backend)
    if kind == "dense":
        from common.retrieval.dense import DenseRetriever

        return DenseRetriever.load(folder, mmap=mmap, faiss_gpu=faiss_gpu)
    raise ValueError(f"{Path(folder) / CONFIG_FILE}: unknown kind {kind!r}; expected bm25 or dense")


def build_index(
    corpus: str | Path,
    out: str | Path,
    dense_encoder: str | Path | None = None,
    index_type: str = "flat",
    batch_size: int = 64,
    backend: str = "auto",
) -> CorpusRetriever:
    """Index a jsonl corpus into `out`: BM25, or dense when an encoder folder is given."""
    docs = read_corpus(corpus)
    retriever: CorpusRetriever
    if dense_encoder is None:
        from common.retrieval.bm25 import BM25Retriever

        retriever = BM25Retriever.from_docs(docs, backend=backend, show_progress=True)
    else:
        from common.retrieval.dense import DenseRetriever, Encoder

        encoder = Encoder(dense_encoder, batch_size=batch_size)
        retriever = DenseRetriever.build(docs, encoder, index_type)
    retriever.save(out)
    return retriever
