"""QA examples and their loaders.

``load_qa(path)`` reads a JSON list or a jsonl file, or takes the rows of a ``datasets.Dataset``
or a list of dicts in place of a file; ``format="auto"`` picks the format from the keys of the
first row:

- ``flashrag``: ``{id, question, golden_answers, metadata}`` (what ``write_qa_jsonl`` writes);
  ``supporting_titles`` is added from FlashRAG's HotpotQA / 2Wiki ``supporting_facts`` and
  MuSiQue ``paragraphs`` when the metadata has them;
- ``hotpotqa``: the original HotpotQA ``{_id, question, answer, type, level, context
  [[title, [sentences]]], supporting_facts [[title, sent_idx]]}``, or the hub's columnar form
  (``context {title: [...], sentences: [...]}``, ``supporting_facts {title: [...], sent_id: [...]}``);
- ``2wiki``: the original 2WikiMultiHopQA, HotpotQA's shape plus ``evidences [[s, r, o]]``;
- ``musique``: ``{id, question, answer, answer_aliases, paragraphs [{idx, title, paragraph_text,
  is_supporting}]}``; the gold answers are the answer and its aliases;
- ``simple``: ``{question, answer}`` with an optional ``id`` or ``idx``; the answer a string or a list.

Gold answers are always a list of strings. For the paragraph formats ``metadata`` holds
``paragraphs`` (each with at least ``title`` and ``text``; HotpotQA and 2Wiki add ``sentences``,
MuSiQue ``idx`` and ``is_supporting``) and ``supporting_titles``; HotpotQA and 2Wiki also keep
``supporting_facts``. Every other key of a row is kept in ``metadata`` as it is.

An example's id is ``"{source}:{original id}"`` (the row's 0-based index when it has none), where
``source`` defaults to the file's stem; ``source=""`` keeps the ids as written, so a file written by
``write_qa_jsonl`` loads back equal. A bad row is a ``DataError`` naming the file, the 1-based line
and the field. Rows given in memory are named ``<Dataset>, row N`` or ``<list>, row N`` (1-based),
and their ids keep no source unless ``source`` is given.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # datasets is heavy: imported only where a hub split is loaded
    from datasets import Dataset

FORMATS = ("flashrag", "hotpotqa", "2wiki", "musique", "simple")
_HF_PATH = re.compile(r"hf://(?P<id>[^:@]+)(?::(?P<config>[^@]+))?@(?P<split>.+)")
_WHITESPACE = re.compile(r"[ \t\n\r]*")


class DataError(ValueError):
    """A QA file or row that cannot be read."""


@dataclass
class QAExample:
    id: str
    question: str
    golden_answers: list[str]
    metadata: dict[str, Any] = field(default_factory=dict)


def load_qa(
    path: str | Path | Dataset | Sequence[Mapping[str, Any]],
    format: str = "auto",
    source: str | None = None,
) -> list[QAExample]:
    """Load a QA file in one of ``FORMATS`` (or ``hf://owner/name[:config]@split`` from the hub),
    or the rows of a ``datasets.Dataset`` or a list of dicts (``in_memory_rows``)."""
    memory = in_memory_rows(path)
    if memory is not None:
        return _parse_rows(memory[1], memory[0], format, "" if source is None else source)
    match = _HF_PATH.fullmatch(str(path))
    if match:
        return load_hf_qa(match["id"], match["split"], match["config"], format, source)
    if str(path).startswith("hf://"):
        raise DataError(f"hub path {str(path)!r} is not of the form hf://owner/name[:config]@split")
    rows = read_json_rows(Path(path))
    return _parse_rows(rows, str(path), format, _default_source(path) if source is None else source)


def keep_where(
    examples: Sequence[QAExample],
    where: Mapping[str, Sequence[str]],
    matched: set[tuple[str, str]] | None = None,
) -> list[QAExample]:
    """The examples whose ``metadata[key]``, as text, is one of ``where[key]`` for every key;
    ``matched`` collects each ``(key, value)`` some example had."""
    allowed = {k: {str(v) for v in vs} for k, vs in where.items()}
    kept = []
    for ex in examples:
        have = {k: str(ex.metadata.get(k, "")) for k in allowed}
        if matched is not None:
            matched.update((k, v) for k, v in have.items() if v in allowed[k])
        if all(have[k] in allowed[k] for k in allowed):
            kept.append(ex)
    return kept


def check_where(where: Mapping[str, Sequence[str]], name: str) -> None:
    """A question filter (``keep_where``) is usable: every key lists at least one non-empty
    value; a ``ValueError`` naming ``name.key`` (the config key) otherwise."""
    for key, values in where.items():
        if not values or not all(str(v).strip() for v in values):
            raise ValueError(f"{name}.{key} must list at least one non-empty value, got {values!r}")


def load_qa_where(
    path: str | Path | Dataset | Sequence[Mapping[str, Any]],
    where: Mapping[str, Sequence[str]],
    name: str = "where",
) -> list[QAExample]:
    """``load_qa(path)`` kept by ``where`` (``keep_where``; all rows when empty). A value that
    matches no row, or a filter that keeps none, is a ``DataError`` naming ``name`` (the config
    key) and the file."""
    examples = load_qa(path)
    if not where:
        return examples
    matched: set[tuple[str, str]] = set()
    kept = keep_where(examples, where, matched)
    unmatched = [f"{k}={v}" for k, vs in where.items() for v in vs if (k, str(v)) not in matched]
    label = data_label(path)
    if unmatched:
        raise DataError(f"{name}: {', '.join(unmatched)} matches no question in {label}")
    if not kept:
        raise DataError(f"{name}: no question of {label} matches every key of {dict(where)}")
    return kept


def load_hf_qa(
    dataset_id: str,
    split: str,
    config: str | None = None,
    format: str = "auto",
    source: str | None = None,
) -> list[QAExample]:
    """Load a split of a Hugging Face hub dataset whose rows are in one of ``FORMATS``."""
    where = f"hf://{dataset_id}{f':{config}' if config else ''}@{split}"
    labelled = hub_rows(dataset_id, config, split)
    if not labelled:
        raise DataError(f"{where}: the split is empty")
    return _parse_rows(
        labelled, where, format, _default_source(where) if source is None else source
    )


def hub_rows(dataset_id: str, config: str | None, split: str) -> list[tuple[str, Any]]:
    """The rows of a hub dataset split as ``("row N", row)``; a clear error when it cannot load."""
    import datasets  # heavy; only the hub path needs it

    where = f"hf://{dataset_id}{f':{config}' if config else ''}@{split}"
    try:
        rows = datasets.load_dataset(dataset_id, config, split=split)
    except Exception as e:  # the hub raises many types (offline, not found, bad split): one message
        raise DataError(
            f"cannot load {where} from the Hugging Face hub: {type(e).__name__}: {e}\n"
            "Without network (or with HF_HUB_OFFLINE / HF_DATASETS_OFFLINE set) only datasets "
            "already in the local cache load; download it first or point to a local file."
        ) from None
    return _numbered(rows)


def data_label(data: Any) -> str:
    """How messages name a data source: a path as written, ``<Dataset>`` or ``<list>``."""
    if isinstance(data, str | os.PathLike):
        return str(data)
    return "<list>" if isinstance(data, list | tuple) else "<Dataset>"


def in_memory_rows(data: Any) -> tuple[str, list[tuple[str, Any]]] | None:
    """``(where, rows)`` for data given in place of a file: a ``datasets.Dataset`` (``<Dataset>``)
    or a list of dicts (``<list>``), each row labelled ``row N`` (1-based) as a hub split's are;
    None for a path. A ``DatasetDict``, an empty one or another type is a ``DataError``."""
    if isinstance(data, str | os.PathLike):
        return None
    datasets = sys.modules.get("datasets")  # a Dataset means the package is loaded
    if datasets is not None and isinstance(
        data, datasets.DatasetDict | datasets.IterableDatasetDict
    ):
        raise DataError(
            f"a DatasetDict of the splits {sorted(data)}: pass one split, e.g. data['train']"
        )
    if not (
        isinstance(data, list | tuple)
        or (datasets is not None and isinstance(data, datasets.Dataset))
    ):
        raise DataError(
            f"expected a file path, a datasets.Dataset or a list of dicts, got {type(data).__name__}"
        )
    where = data_label(data)
    rows = _numbered(data)
    if not rows:
        raise DataError(f"{where}: no rows")
    return where, rows


def _numbered(rows: Any) -> list[tuple[str, Any]]:
    return [(f"row {i + 1}", row) for i, row in enumerate(rows)]


def load_qa_mix(paths: Sequence[str | Path], format: str = "auto") -> list[QAExample]:
    """Load several QA files; each file's stem is its source, its path when two stems clash."""
    stems = [_default_source(p) for p in paths]
    counts = Counter(stems)
    seen: dict[str, str] = {}
    out = []
    for p, stem in zip(paths, stems, strict=True):
        for ex in load_qa(p, format, stem if counts[stem] == 1 else str(p)):
            if ex.id in seen:
                raise DataError(f"duplicate example id {ex.id!r} in {p} and {seen[ex.id]}")
            seen[ex.id] = str(p)
            out.append(ex)
    return out


def _default_source(path: str | Path) -> str:
    """A file's stem, or a hub dataset's name."""
    match = _HF_PATH.fullmatch(str(path))
    return match["id"].rsplit("/", 1)[-1] if match else Path(path).stem


def write_qa_jsonl(examples: Sequence[QAExample], path: str | Path) -> None:
    """Write examples as FlashRAG jsonl; ``load_qa(path, source="")`` reads them back equal."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for ex in examples:
            f.write(json.dumps(dataclasses.asdict(ex), ensure_ascii=False) + "\n")


def read_json_rows(path: Path) -> list[tuple[str, Any]]:
    """(``"line N"``, decoded JSON value) for each row of a jsonl file or a JSON list."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"cannot read QA file {path}: {e}") from None
    if text.lstrip().startswith("["):
        rows = _json_list_rows(text, path)
    else:
        rows = []
        # split on "\n" only: str.splitlines would also break inside strings at U+2028 and kin
        for n, line in enumerate(text.split("\n"), 1):
            if line.strip():
                try:
                    rows.append((f"line {n}", json.loads(line)))
                except json.JSONDecodeError as e:
                    raise DataError(
                        f"{path}, line {n}: invalid JSON: {e.msg} (column {e.colno})"
                    ) from None
    if not rows:
        raise DataError(f"{path}: no rows (the file is empty)")
    return rows


def _json_list_rows(text: str, path: Path) -> list[tuple[str, Any]]:
    """The elements of a JSON list, each with the line it starts on (json.load gives no positions)."""
    decoder = json.JSONDecoder()
    rows: list[tuple[str, Any]] = []
    pos, last, line = text.index("[") + 1, 0, 1
    while True:
        pos = _WHITESPACE.match(text, pos).end()
        line, last = line + text.count("\n", last, pos), pos  # counted incrementally: files are big
        if text.startswith("]", pos) and not rows:
            break
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise DataError(
                f"{path}, line {e.lineno}: invalid JSON: {e.msg} (column {e.colno})"
            ) from None
        rows.append((f"line {line}", value))
        pos = _WHITESPACE.match(text, pos).end()
        if text.startswith(",", pos):
            pos += 1
        elif text.startswith("]", pos):
            break
        else:
            bad = line + text.count("\n", last, pos)
            raise DataError(f"{path}, line {bad}: invalid JSON: expected ',' or ']' in the list")
    if text[pos + 1 :].strip():
        raise DataError(f"{path}: invalid JSON: extra data after the closing ']'")
    return rows


class _FieldError(Exception):
    def __init__(self, field: str, problem: str) -> None:
        super().__init__(field, problem)
        self.field, self.problem = field, problem


def _parse_rows(
    rows: list[tuple[str, Any]], where: str, format: str, source: str
) -> list[QAExample]:
    if format == "auto":
        format = _detect(rows[0][1], f"{where}, {rows[0][0]}")
    elif format not in _PARSERS:
        raise DataError(
            f"unknown QA format {format!r}; choose 'auto' or one of {', '.join(FORMATS)}"
        )
    seen: dict[str, str] = {}
    out = []
    for index, (label, row) in enumerate(rows):
        try:
            if not isinstance(row, dict):
                raise _FieldError("<row>", f"expected a JSON object, got {_show(row)}")
            original_id, question, golds, metadata = _PARSERS[format](row)
        except _FieldError as e:
            raise DataError(
                f"{where}, {label}: field {e.field!r}: {e.problem} ({format} format)"
            ) from None
        original = str(index if original_id is None else original_id)
        ex_id = f"{source}:{original}" if source else original
        if ex_id in seen:
            raise DataError(f"{where}, {label}: duplicate id {original!r} (first at {seen[ex_id]})")
        seen[ex_id] = label
        out.append(QAExample(ex_id, question, golds, metadata))
    return out


def _detect(row: Any, where: str) -> str:
    keys = set(row) if isinstance(row, dict) else set()
    if "golden_answers" in keys:
        return "flashrag"
    if "paragraphs" in keys:
        return "musique"
    if {"context", "supporting_facts"} <= keys:
        return "2wiki" if "evidences" in keys else "hotpotqa"
    if {"question", "answer"} <= keys:
        return "simple"
    raise DataError(
        f"{where}: cannot tell the QA format from the keys {sorted(keys)}; "
        f"pass format= one of {', '.join(FORMATS)}"
    )


Parsed = tuple[Any, str, list[str], dict[str, Any]]  # original id, question, golds, metadata


def _flashrag(row: dict[str, Any]) -> Parsed:
    metadata = dict(_get(row, "metadata", dict, required=False) or {})
    if "supporting_titles" not in metadata:
        titles = _flashrag_supporting_titles(metadata)
        if titles:
            metadata["supporting_titles"] = titles
    return _id(row, "id"), _question(row), _golds(row, "golden_answers"), metadata


def _flashrag_supporting_titles(metadata: dict[str, Any]) -> list[str]:
    """The supporting titles FlashRAG keeps in ``metadata``: HotpotQA's and 2Wiki's
    ``supporting_facts`` (columnar ``{title: [...], sent_id: [...]}`` or ``[[title, i], ...]``),
    MuSiQue's ``paragraphs`` with ``is_supporting``; [] when there are none (NQ, TriviaQA, ...)."""
    facts = metadata.get("supporting_facts")
    if isinstance(facts, dict):
        titles = facts.get("title")
        if not isinstance(titles, list) or not all(isinstance(t, str) for t in titles):
            raise _FieldError("metadata.supporting_facts.title", "expected a list of titles")
        return list(dict.fromkeys(titles))
    if isinstance(facts, list):
        if not all(isinstance(f, list) and f and isinstance(f[0], str) for f in facts):
            raise _FieldError("metadata.supporting_facts", "expected [[title, sent_id], ...]")
        return list(dict.fromkeys(f[0] for f in facts))
    paragraphs = metadata.get("paragraphs")
    if isinstance(paragraphs, list) and all(isinstance(p, dict) for p in paragraphs):
        return list(
            dict.fromkeys(
                str(p["title"]) for p in paragraphs if p.get("is_supporting") and "title" in p
            )
        )
    return []


def _simple(row: dict[str, Any]) -> Parsed:
    key = "id" if "id" in row else "idx"
    rest = {k: v for k, v in row.items() if k not in (key, "question", "answer")}
    return _id(row, key), _question(row), _golds(row, "answer"), rest


def _hotpotqa(row: dict[str, Any]) -> Parsed:
    key = "_id" if "_id" in row else "id"
    context = _pairs(row, "context", "sentences", str, list)
    facts = _pairs(row, "supporting_facts", "sent_id", str, int)
    for i, (_, sentences) in enumerate(context):
        if not all(isinstance(s, str) for s in sentences):
            raise _FieldError(f"context[{i}]", "sentences must be strings")
    rest = {
        k: v
        for k, v in row.items()
        if k not in (key, "question", "answer", "context", "supporting_facts")
    }
    metadata = {
        "paragraphs": [{"title": t, "text": _join(s), "sentences": list(s)} for t, s in context],
        "supporting_titles": list(dict.fromkeys(t for t, _ in facts)),
        "supporting_facts": [[t, i] for t, i in facts],
        **rest,
    }
    return _id(row, key), _question(row), _golds(row, "answer"), metadata


def _2wiki(row: dict[str, Any]) -> Parsed:
    evidences = _get(row, "evidences", list)
    for i, triple in enumerate(evidences):
        if not (
            isinstance(triple, list)
            and len(triple) == 3
            and all(isinstance(x, str) for x in triple)
        ):
            raise _FieldError(
                f"evidences[{i}]", f"expected [subject, relation, object], got {_show(triple)}"
            )
    return _hotpotqa(row)


def _musique(row: dict[str, Any]) -> Parsed:
    paragraphs = []
    for i, p in enumerate(_get(row, "paragraphs", list)):
        name = f"paragraphs[{i}]"
        if not isinstance(p, dict):
            raise _FieldError(name, f"expected an object, got {_show(p)}")
        try:
            paragraphs.append(
                {
                    "title": _get(p, "title", str),
                    "text": _get(p, "paragraph_text", str),
                    "idx": _get(p, "idx", int, required=False),
                    "is_supporting": bool(_get(p, "is_supporting", bool, required=False)),
                }
            )
        except _FieldError as e:
            raise _FieldError(f"{name}.{e.field}", e.problem) from None
    golds = _golds(row, "answer") + _golds(row, "answer_aliases", required=False)
    consumed = ("id", "question", "answer", "answer_aliases", "paragraphs")
    metadata = {
        "paragraphs": paragraphs,
        "supporting_titles": list(
            dict.fromkeys(p["title"] for p in paragraphs if p["is_supporting"])
        ),
        **{k: v for k, v in row.items() if k not in consumed},
    }
    return _id(row, "id"), _question(row), list(dict.fromkeys(golds)), metadata


_PARSERS: dict[str, Callable[[dict[str, Any]], Parsed]] = {
    "flashrag": _flashrag,
    "hotpotqa": _hotpotqa,
    "2wiki": _2wiki,
    "musique": _musique,
    "simple": _simple,
}


def _get(
    row: dict[str, Any], key: str, kind: type | tuple[type, ...], required: bool = True
) -> Any:
    if key not in row or (row[key] is None and not required):
        if required:
            raise _FieldError(key, "missing")
        return None
    value = row[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise _FieldError(key, f"expected {names}, got {_show(value)}")
    return value


def _id(row: dict[str, Any], key: str) -> str | int | None:
    return _get(row, key, (str, int), required=False)


def _question(row: dict[str, Any]) -> str:
    question = _get(row, "question", str)
    if not question.strip():
        raise _FieldError("question", "is empty")
    return question


def _golds(row: dict[str, Any], key: str, required: bool = True) -> list[str]:
    """A gold answer or a list of them as a list of strings (numbers become their text).

    An optional field (MuSiQue's aliases) may be absent or an empty list.
    """
    value = _get(row, key, (str, int, float, list), required)
    answers = [] if value is None else value if isinstance(value, list) else [value]
    for i, a in enumerate(answers):
        if isinstance(a, bool) or not isinstance(a, str | int | float) or not str(a).strip():
            raise _FieldError(
                f"{key}[{i}]" if isinstance(value, list) else key, f"bad answer {_show(a)}"
            )
    if not answers and required:
        raise _FieldError(key, "no answers")
    return [str(a) for a in answers]


def _pairs(
    row: dict[str, Any], key: str, column: str, first: type, second: type
) -> list[tuple[Any, Any]]:
    """``[[a, b], ...]`` rows, or the hub's columnar ``{title: [a...], column: [b...]}``, as pairs."""
    value = _get(row, key, (list, dict))
    if isinstance(value, dict):
        titles, seconds = value.get("title"), value.get(column)
        if not (
            isinstance(titles, list) and isinstance(seconds, list) and len(titles) == len(seconds)
        ):
            raise _FieldError(
                key, f"expected lists 'title' and {column!r} of one length, got {_show(value)}"
            )
        value = [list(p) for p in zip(titles, seconds, strict=True)]
    for i, pair in enumerate(value):
        if not (
            isinstance(pair, list)
            and len(pair) == 2
            and isinstance(pair[0], first)
            and isinstance(pair[1], second)
            and not isinstance(pair[1], bool)
        ):
            raise _FieldError(
                f"{key}[{i}]", f"expected [{first.__name__}, {second.__name__}], got {_show(pair)}"
            )
    return [(a, b) for a, b in value]


def _join(sentences: Sequence[str]) -> str:
    """Sentences as one paragraph: HotpotQA's carry their leading space, others get one."""
    text = ""
    for s in sentences:
        text += s if not text or text[-1].isspace() or s[:1].isspace() else " " + s
    return text.strip()


def _show(value: Any) -> str:
    text = repr(value)
    return (
        f"{text[:80]}... ({type(value).__name__})"
        if len(text) > 80
        else f"{text} ({type(value).__name__})"
    )
