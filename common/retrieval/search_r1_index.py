"""Search-R1's own dense index, opened as it is downloaded: no re-encoding of 21M passages.

Search-R1's `download.py` fetches `e5_Flat.index` (a FAISS IndexFlatIP of e5-base-v2 passage
vectors, 65 GB) and `wiki-18.jsonl` (one `{"id", "contents"}` row a passage, in the index's
order), and its server encodes queries with e5-base-v2 ("query: " prefix, mean pooling over
the tokens, L2-normalised, 256 tokens), as `dense.Encoder` does. A folder holding one
`*.index` file and one `*.jsonl` file is such an index (`search_r1_files`).

The corpus is read through a memory map: its row offsets are found once (a pass over the
file's bytes, with progress) and cached beside it as `<corpus>.offsets.npy` when the folder is
writable (checked against the file's size when reused). The index's vectors are memory-mapped
(faiss's IO_FLAG_MMAP_IFC); with a GPU build of faiss and a GPU the index is copied to every GPU
in fp16, sharded, as Search-R1's `--faiss_gpu` does (`dense.place_index`; never run here: no GPU).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm.auto import tqdm

from common.retrieval.doc_store import MappedDocStore

if TYPE_CHECKING:
    from common.retrieval.dense import DenseRetriever

E5 = "intfloat/e5-base-v2"
_CHUNK = 64 << 20


def search_r1_files(folder: str | Path) -> tuple[Path, Path] | None:
    """(index file, corpus file) when ``folder`` holds exactly one ``*.index`` and one
    ``*.jsonl`` (Search-R1's `e5_Flat.index` and `wiki-18.jsonl`); else None."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    indexes, corpora = sorted(folder.glob("*.index")), sorted(folder.glob("*.jsonl"))
    if len(indexes) == 1 and len(corpora) == 1:
        return indexes[0], corpora[0]
    return None


def search_r1_download(folder: str | Path) -> str | None:
    """What to run when ``folder`` holds Search-R1's download as it lands (``download.py``
    leaves the index in parts, ``part_aa`` ``part_ab``, and the corpus gzipped,
    ``wiki-18.jsonl.gz``) rather than the two files ``serve`` reads; else None."""
    folder = Path(folder)
    if not folder.is_dir() or search_r1_files(folder):
        return None
    parts = sorted(p.name for p in folder.glob("part_*") if p.is_file())
    zipped = sorted(p.name for p in folder.glob("*.jsonl.gz") if p.is_file())
    if not (parts or zipped):
        return None
    steps = []
    if parts:
        steps.append(f"`cat {folder}/part_* > {folder}/e5_Flat.index`")
    steps += [f"`gzip -d {folder / name}`" for name in zipped]
    return (
        f"{folder}: holds Search-R1's download as it lands ({', '.join(parts + zipped)}), not "
        f"yet the index and corpus serve opens: `make data-index INDEX={folder}` joins and "
        f"unzips them in place (and fetches what is missing), or by hand: {' and '.join(steps)}"
    )


def line_offsets(path: str | Path, progress: bool = True) -> np.ndarray:
    """int64 byte offsets of a jsonl file's rows and its end: row i is the bytes
    ``offsets[i]:offsets[i + 1]``. Blank lines are no rows (their bytes go to the next row,
    whose JSON parses the same)."""
    path = Path(path)
    size = path.stat().st_size
    ends: list[np.ndarray] = []
    previous = -1  # the position of the last newline seen
    with (
        open(path, "rb") as f,
        tqdm(
            total=size, unit="B", unit_scale=True, desc=f"rows of {path.name}", disable=not progress
        ) as bar,
    ):
        start = 0
        while chunk := f.read(_CHUNK):
            newlines = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10) + start
            if len(newlines):
                gaps = np.diff(newlines, prepend=previous)
                ends.append(newlines[gaps > 1] + 1)  # a line with something before its newline
                previous = int(newlines[-1])
            start += len(chunk)
            bar.update(len(chunk))
    offsets = np.concatenate([np.zeros(1, np.int64), *ends]).astype(np.int64)
    if size > previous + 1 and size > offsets[-1]:  # a last row without a newline
        offsets = np.append(offsets, np.int64(size))
    return offsets


def corpus_offsets(corpus: Path) -> np.ndarray:
    """``line_offsets(corpus)``, from ``<corpus>.offsets.npy`` when it is there and ends at the
    file's size; else computed, and saved there when the folder is writable."""
    cache = corpus.with_name(corpus.name + ".offsets.npy")
    size = corpus.stat().st_size
    if cache.is_file():
        offsets = np.load(cache, mmap_mode="r")
        if len(offsets) and int(offsets[-1]) == size:
            return offsets
    offsets = line_offsets(corpus)
    with contextlib.suppress(OSError):  # a read-only download: kept in memory (8 bytes a row)
        np.save(cache, offsets)
    return offsets


def open_search_r1(
    index_file: str | Path,
    corpus: str | Path,
    encoder: str | Path = E5,
    *,
    gpu: bool | str = True,
    device: str | None = None,
) -> DenseRetriever:
    """A ``DenseRetriever`` over Search-R1's index file and corpus, queries encoded by
    ``encoder`` (a folder or hub id; e5-base-v2's recipe). ``gpu``: where FAISS searches,
    ``dense.place_index``'s ``auto`` / ``on`` / ``off`` (True: auto, False: off); the
    retriever's ``index_where`` says where it went."""
    from common.retrieval.dense import DenseRetriever, Encoder, import_faiss, place_index

    faiss = import_faiss()
    index_file, corpus = Path(index_file), Path(corpus)
    for path in (index_file, corpus):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file")
    enc = Encoder(encoder, device=device)
    index = faiss.read_index(str(index_file), faiss.IO_FLAG_MMAP_IFC)
    if index.d != enc.dim:
        raise ValueError(f"{index_file}: vectors have dim {index.d}, encoder {encoder} {enc.dim}")
    docs = MappedDocStore(corpus, corpus_offsets(corpus))
    if index.ntotal != len(docs):
        raise ValueError(
            f"{index_file} holds {index.ntotal:,} vectors and {corpus} {len(docs):,} rows: "
            "not the index of this corpus"
        )
    mode = ("auto" if gpu else "off") if isinstance(gpu, bool) else gpu
    index, where = place_index(index, mode)
    return DenseRetriever(enc, index, docs, index_where=where)
