"""The files of an index folder: passage texts looked up by row number, and the config.

`retriever.json` says which retriever the folder holds and its settings. The texts are `docs.jsonl` (a valid Search-R1 corpus, `{"id", "contents"}` a line)
plus `docs.offsets.npy` (int64 byte offsets of the N lines and the file end). Loaded with
`mmap=True`, a lookup reads one line through a memory map: resident memory stays
small for a 21M-passage corpus, and slicing the map (no seek) is safe across threads.
"""

from __future__ import annotations

import gc
import json
import mmap
from array import array
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from common.retrieval.base import Doc, doc_contents, parse_row

CONFIG_FILE = "retriever.json"
DOCS_FILE = "docs.jsonl"
OFFSETS_FILE = "docs.offsets.npy"


def write_config(folder: str | Path, config: dict) -> None:
    (Path(folder) / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


def read_config(folder: str | Path, kind: str | None = None) -> dict:
    """The folder's config; `kind` (e.g. "bm25") must match when given."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: missing {CONFIG_FILE}; not a saved index folder")
    config = json.loads(path.read_text())
    if kind is not None and config.get("kind") != kind:
        raise ValueError(f"{path}: kind is {config.get('kind')!r}, expected {kind!r}")
    return config


def save_docs(docs: Iterable[Doc], folder: str | Path) -> int:
    """Write docs into `folder` in store format; returns how many were written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    offsets = array("q", [0])
    with open(folder / DOCS_FILE, "wb") as f:
        for doc in docs:
            row = {"id": doc.id, "contents": doc_contents(doc)}
            line = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
            f.write(line)
            offsets.append(offsets[-1] + len(line))
    np.save(folder / OFFSETS_FILE, np.frombuffer(offsets, dtype=np.int64))
    return len(offsets) - 1


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for a burst of allocations (no cycles are made)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _cut_at_non_positive(
    ids: list[list[int]], scores: list[list[float]]
) -> tuple[list[list[int]], list[list[float]]]:
    """Rows sorted best first, cut before their first score <= 0 (a row's last is the lowest)."""
    cut_ids, cut_scores = [], []
    for row, srow in zip(ids, scores, strict=True):
        if srow and srow[-1] <= 0.0:
            n = next(i for i, s in enumerate(srow) if s <= 0.0)
            row, srow = row[:n], srow[:n]
        cut_ids.append(row)
        cut_scores.append(srow)
    return cut_ids, cut_scores


class DocStore:
    """Docs held in memory."""

    def __init__(self, docs: Sequence[Doc]):
        self._docs = list(docs)
        self._fields = [(d.id, d.title, d.text) for d in self._docs]

    def __len__(self) -> int:
        return len(self._docs)

    def take(
        self, ids: list[list[int]], scores: list[list[float]], positive: bool = False
    ) -> list[list[Doc]]:
        """Docs for rows of (doc index, score) pairs, e.g. one row per query.

        `positive=True` keeps only the docs of positive score (rows are sorted best first).
        """
        if positive:
            ids, scores = _cut_at_non_positive(ids, scores)
        # This loop is the wrapper's whole overhead over bm25s (ten records a query against
        # bm25s's ~10 us search): tuple.__new__ is a third of the cost of calling Doc(...),
        # and pausing the garbage collector, which the new records would otherwise wake
        # every 700 allocations, saves another third.
        fields, new = self._fields, tuple.__new__
        with gc_paused():
            return [
                [new(Doc, fields[i] + (s,)) for i, s in zip(row, srow)]  # noqa: B905 (one array)
                for row, srow in zip(ids, scores, strict=True)
            ]

    def save(self, folder: str | Path) -> None:
        save_docs(self._docs, folder)

    @staticmethod
    def load(folder: str | Path, mmap: bool = True) -> DocStore:
        """Open a saved store: memory-mapped, or read whole into memory."""
        folder = Path(folder)
        for name in (DOCS_FILE, OFFSETS_FILE):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"{folder}: missing {name}; not a saved index folder")
        if mmap:
            return MappedDocStore(folder / DOCS_FILE, np.load(folder / OFFSETS_FILE, mmap_mode="r"))
        path = folder / DOCS_FILE
        with open(path, encoding="utf-8") as f:
            return DocStore(
                [parse_row(json.loads(line), f"{path}:{n}") for n, line in enumerate(f, 1)]
            )


class MappedDocStore(DocStore):
    """Docs read on demand from a memory-mapped jsonl (an index folder's `docs.jsonl`, or a
    Search-R1 corpus): row i is the bytes `offsets[i]:offsets[i + 1]`."""

    def __init__(self, path: Path, offsets: np.ndarray):
        self._path = Path(path)
        self._offsets = offsets
        with open(self._path, "rb") as f:
            # An empty corpus cannot be mapped; it has no rows to look up either.
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if len(self) else b""

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def get(self, i: int, score: float) -> Doc:
        start, end = int(self._offsets[i]), int(self._offsets[i + 1])
        d = parse_row(json.loads(self._map[start:end]), f"{self._path}:{i + 1}")
        return Doc(d.id, d.title, d.text, score)

    def take(
        self, ids: list[list[int]], scores: list[list[float]], positive: bool = False
    ) -> list[list[Doc]]:
        if positive:
            ids, scores = _cut_at_non_positive(ids, scores)
        get = self.get
        return [list(map(get, row, srow)) for row, srow in zip(ids, scores, strict=True)]

    def save(self, folder: str | Path) -> None:
        # Saving into the folder it maps would truncate the file while reading it.
        if Path(folder, DOCS_FILE).resolve() != self._path.resolve():
            save_docs((self.get(i, 0.0) for i in range(len(self))), folder)
