"""Retrieval records and the corpus format shared by every retriever.

The corpus format is Search-R1's: one JSON object a line, `{"id", "contents"}`, where
`contents` is `"Title"\\ntext` (the title line in double quotes). `{"id", "title", "text"}`
rows are read as well.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple, Protocol, runtime_checkable

from common.jsonl import NotUTF8, utf8_text


class Doc(NamedTuple):
    """One retrieved passage; `score` is the retriever's relevance (0.0 when unknown).

    A named tuple rather than a frozen dataclass: retrievers build ten of these per query,
    and a tuple is built in a fifth of the time (see `DocStore.take`).
    """

    id: str
    title: str
    text: str
    score: float


@runtime_checkable
class Retriever(Protocol):
    """Anything that answers a batch of queries with the top-k passages of each."""

    def search(self, queries: list[str], k: int) -> list[list[Doc]]: ...


class CorpusRetriever(Retriever, Protocol):
    """A retriever over a whole corpus that can be written into an index folder."""

    def __len__(self) -> int: ...

    def save(self, folder: str | Path) -> None: ...


class CorpusError(ValueError):
    """A corpus row that cannot be read; the message names file, line and field."""


def parse_contents(contents: str) -> tuple[str, str]:
    """Split Search-R1 `contents` into (title, text).

    The title is the first line with one pair of surrounding double quotes removed; a
    contents string without a newline has an empty title and is all text.
    """
    if "\n" not in contents:
        return "", contents
    title, text = contents.split("\n", 1)
    if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        title = title[1:-1]
    return title, text


def doc_contents(doc: Doc) -> str:
    """The Search-R1 `contents` string of a doc: `"Title"\\ntext`.

    An empty title gives the bare text, unless the text holds a newline: then the title
    line is `""` so that `parse_contents` gives the same doc back.
    """
    if "\n" in doc.title:
        raise ValueError(f"doc {doc.id!r}: a title cannot contain a newline: {doc.title!r}")
    if not doc.title and "\n" not in doc.text:
        return doc.text
    return f'"{doc.title}"\n{doc.text}'


def format_docs(docs: Sequence[Doc]) -> str:
    """Render docs exactly as Search-R1 shows them to the policy.

    Search-R1 takes the first line of `contents` as the title (quotes kept) and the rest as
    the text, one doc a line: `Doc 1(Title: "T") text\\n`.
    """
    lines = []
    for i, doc in enumerate(docs, start=1):
        title, _, text = doc_contents(doc).partition("\n")
        lines.append(f"Doc {i}(Title: {title}) {text}\n")
    return "".join(lines)


def _field(row: dict, key: str, where: str) -> str:
    if key not in row:
        raise CorpusError(f"{where}: missing field {key!r}")
    value = row[key]
    if key == "id" and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise CorpusError(f"{where}: field {key!r} must be a string, got {type(value).__name__}")
    return value


def parse_row(row: object, where: str) -> Doc:
    """One corpus row (`{id, contents}` or `{id, title, text}`) as a Doc with score 0.0."""
    if not isinstance(row, dict):
        raise CorpusError(f"{where}: expected a JSON object, got {type(row).__name__}")
    doc_id = _field(row, "id", where)
    if "contents" in row:
        title, text = parse_contents(_field(row, "contents", where))
    else:
        if "title" not in row and "text" not in row:
            raise CorpusError(f"{where}: missing field 'contents' (or 'title' and 'text')")
        title, text = _field(row, "title", where), _field(row, "text", where)
        if "\n" in title:
            raise CorpusError(f"{where}: field 'title' cannot contain a newline")
    return Doc(doc_id, title, text, 0.0)


def iter_corpus(path: str | Path) -> Iterator[Doc]:
    """Stream the docs of a jsonl corpus; blank lines are skipped, bad rows raise CorpusError (a
    byte that is not UTF-8 names its line and its byte in it; a UTF-8 byte order mark at the
    start is dropped)."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            try:
                line = utf8_text(raw, lineno)
            except NotUTF8 as e:
                raise CorpusError(f"{where}: not UTF-8 text ({e})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusError(f"{where}: invalid JSON ({e.msg})") from None
            yield parse_row(row, where)


def read_corpus(path: str | Path) -> list[Doc]:
    """All docs of a jsonl corpus (see `iter_corpus`)."""
    return list(iter_corpus(path))
