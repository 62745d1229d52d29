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

A file is parquet when its name ends in ``.parquet`` or it starts with parquet's magic bytes
(``PAR1``): its rows are read with pyarrow and named ``row N`` (1-based), e.g. Search-R1's
``train.parquet`` (``{id, question, golden_answers, data_source, prompt, reward_model, ...}``:
FlashRAG's columns plus Search-R1's, read as ``flashrag``). Any other file is jsonl or a JSON list;
one that is not UTF-8 text is a ``DataError`` naming the line, the byte within it and the formats
read. A UTF-8 byte order mark at the start of a file is dropped (Windows editors write one).

Bad rows are found at load, before any model or engine loads (``read_rows``, ``load_qa``):

- text: every string of a row (keys included) must encode to UTF-8, which a lone surrogate such as
  the escape ``"\\ud800"`` (``json.loads`` accepts it) does not; such a row cannot be tokenized or
  written and is a ``DataError`` naming the file, the line and the field (``check_text``). The
  question must be a non-empty string.
- answers (``answer_text``, shared with ``cer.data``): a string as written; an int as its digits; a
  float that is integral (and at most 2**53 in size) as the integer's digits (``27.0`` -> ``"27"``,
  ``1.5e3`` -> ``"1500"``); any other float as Python's ``repr``, the shortest text that reads back
  as the same float (``0.1`` -> ``"0.1"``, ``1e-05``, ``1e+20``). ``NaN`` and ``Infinity`` (which
  Python's JSON reads) and ``true``/``false`` (yes/no? true/false?) are a ``DataError`` naming the
  file, line and field: write such an answer as a string.
- over-long questions: ``max_question_chars`` (none by default) is the caller's prompt budget in
  characters (``question_char_limit``: its token budget times ``CHARS_PER_TOKEN_BOUND``). A longer
  question is a counted skip, as CER leaves out prompts over ``max_prompt_tokens``
  (``cer.evaluate.load_problems``): the row is left out, ``"<file>, line N: ..."`` appended to
  ``skipped`` and a warning logged with the count and the first; a file with no row left is a
  ``DataError``. The bound is generous, not exact: a question under it whose prompt is still over
  the budget in tokens is not caught here (CER's token count catches it; a search agent's prompt
  reaches the rollout); what it stops at load is the absurd row (a 1 MB question).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.jsonl import NotUTF8, utf8_text

if TYPE_CHECKING:  # datasets is heavy: imported only where a hub split is loaded
    from datasets import Dataset

FORMATS = ("flashrag", "hotpotqa", "2wiki", "musique", "simple")
_HF_PATH = re.compile(r"hf://(?P<id>[^:@]+)(?::(?P<config>[^@]+))?@(?P<split>.+)")
_WHITESPACE = re.compile(r"[ \t\n\r]*")
# the only way a decoded JSON string gets a surrogate: a \uD800-\uDFFF escape (a pair is joined)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
PARQUET_MAGIC = b"PAR1"
# A generous bound on the characters of a token, averaged over a question: English text is about
# 4 with the Qwen and Llama tokenizers; a question over budget x 8 characters cannot be a question
# the budget was meant for.
CHARS_PER_TOKEN_BOUND = 8
_EXACT_INTS = 2**53  # floats up to this size are exact integers
log = logging.getLogger(__name__)


class DataError(ValueError):
    """A QA file or row that cannot be read."""


class TextTooLong(DataError):
    """A text over the caller's character bound (``check_text``): the loaders that skip over-long
    prompts catch it and count the row."""


def question_char_limit(*token_limits: int) -> int:
    """The character bound of a question for a prompt budget of ``min(token_limits)`` tokens
    (e.g. ``agent.max_context`` and ``engine.max_model_len``): that times
    ``CHARS_PER_TOKEN_BOUND``."""
    return min(token_limits) * CHARS_PER_TOKEN_BOUND


def check_text(value: Any, where: str, max_chars: int | None = None) -> str:
    """``value`` when it is text a tokenizer takes: a ``str`` that encodes to UTF-8 (no lone
    surrogate) and, when ``max_chars`` is given, has at most that many characters. A
    ``DataError`` starting with ``where`` (e.g. ``"q.jsonl, line 3: field 'question'"``)
    otherwise; ``TextTooLong`` for the length alone."""
    if not isinstance(value, str):
        raise DataError(f"{where}: expected text, got {_show(value)}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise DataError(
                f"{where}: the lone surrogate {value[e.start]!r} at character {e.start} is not "
                "text (a \\uD800-\\uDFFF escape without its pair): it cannot be encoded as "
                "UTF-8 nor tokenized"
            ) from None
    if max_chars is not None and len(value) > max_chars:
        raise TextTooLong(
            f"{where}: {len(value):,} characters, over the bound of {max_chars:,} "
            f"(the prompt budget in tokens x {CHARS_PER_TOKEN_BOUND})"
        )
    return value


def check_strings(value: Any, where: str, path: str = "") -> None:
    """``check_text`` on every string of a decoded row, dict keys included; the error names the
    field (``field 'metadata.paragraphs[0].text'``)."""
    if isinstance(value, str):
        check_text(value, f"{where}: field {path or '<row>'!r}")
    elif isinstance(value, dict):
        for k, v in value.items():
            name = f"{path}.{k}" if path else str(k)
            if isinstance(k, str):
                check_text(k, f"{where}: key of field {path or '<row>'!r}")
            check_strings(v, where, name)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            check_strings(v, where, f"{path}[{i}]")


def answer_text(value: Any) -> str:
    """A gold answer as text, the one rule of every loader: a string as it is; an int as its
    digits; an integral float up to 2**53 in size as the integer's digits (``27.0`` -> ``"27"``,
    ``1.5e3`` -> ``"1500"``); another float as its ``repr``, the shortest text that reads back as
    the same float (``0.1`` -> ``"0.1"``, ``1e+20``). A ``ValueError`` for a bool, a
    non-finite float (``NaN``, ``Infinity``: what would be the gold text "nan"?) or another type;
    the caller adds the file, line and field."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        raise ValueError(f"a boolean answer ({value!r}) is ambiguous: write it as a string")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"a non-finite number ({value!r}) is not an answer")
        if value.is_integer() and abs(value) <= _EXACT_INTS:
            return str(int(value))
        return repr(value)
    raise ValueError(f"expected a string or a number, got {_show(value)}")


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
    max_question_chars: int | None = None,
    skipped: list[str] | None = None,
) -> list[QAExample]:
    """Load a QA file in one of ``FORMATS`` (jsonl, a JSON list or parquet; or
    ``hf://owner/name[:config]@split`` from the hub), or the rows of a ``datasets.Dataset`` or a
    list of dicts (``in_memory_rows``). A question over ``max_question_chars`` characters
    (``question_char_limit``) is left out, counted in ``skipped`` and logged."""
    limits = (max_question_chars, skipped)
    memory = in_memory_rows(path)
    if memory is not None:
        return _parse_rows(memory[1], memory[0], format, "" if source is None else source, *limits)
    match = _HF_PATH.fullmatch(str(path))
    if match:
        return load_hf_qa(match["id"], match["split"], match["config"], format, source, *limits)
    if str(path).startswith("hf://"):
        raise DataError(f"hub path {str(path)!r} is not of the form hf://owner/name[:config]@split")
    rows = read_rows(Path(path))
    source = _default_source(path) if source is None else source
    return _parse_rows(rows, str(path), format, source, *limits)


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
    max_question_chars: int | None = None,
) -> list[QAExample]:
    """``load_qa(path)`` kept by ``where`` (``keep_where``; all rows when empty). A value that
    matches no row, or a filter that keeps none, is a ``DataError`` naming ``name`` (the config
    key) and the file. ``max_question_chars``: ``load_qa``'s."""
    examples = load_qa(path, max_question_chars=max_question_chars)
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
    max_question_chars: int | None = None,
    skipped: list[str] | None = None,
) -> list[QAExample]:
    """Load a split of a Hugging Face hub dataset whose rows are in one of ``FORMATS``
    (``max_question_chars``, ``skipped``: ``load_qa``'s)."""
    where = f"hf://{dataset_id}{f':{config}' if config else ''}@{split}"
    labelled = hub_rows(dataset_id, config, split)
    if not labelled:
        raise DataError(f"{where}: the split is empty")
    source = _default_source(where) if source is None else source
    return _parse_rows(labelled, where, format, source, max_question_chars, skipped)


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
    if isinstance(data, list | tuple):  # a Dataset's strings are Arrow's, valid UTF-8
        for label, row in rows:
            check_strings(row, f"{where}, {label}")
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


def is_parquet(path: Path) -> bool:
    """Whether ``path`` is a parquet file: by its name (``.parquet``) or its magic bytes."""
    if path.suffix == ".parquet":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC
    except OSError:
        return False  # read_json_rows says why


def read_rows(path: Path) -> list[tuple[str, Any]]:
    """(``"line N"`` or ``"row N"``, row) for each row of a jsonl, JSON list or parquet file
    (``is_parquet``); a parquet file's rows are named ``row N`` (1-based)."""
    if not is_parquet(path):
        return read_json_rows(path)
    import pyarrow.parquet as pq  # a declared dependency (and one of datasets')

    try:
        table = pq.read_table(path)
        rows = table.to_pylist()
    except Exception as e:  # pyarrow raises several types for a missing or bad file
        raise DataError(f"cannot read parquet file {path}: {type(e).__name__}: {e}") from None
    if not rows:
        raise DataError(f"{path}: no rows (the parquet file is empty)")
    # Arrow's strings are valid UTF-8 (no surrogate): no check_strings
    return _numbered(rows)


def read_json_rows(path: Path) -> list[tuple[str, Any]]:
    """(``"line N"``, decoded JSON value) for each row of a jsonl file or a JSON list. A row whose
    text has a surrogate escape has its strings checked (``check_strings``): a lone surrogate is
    a ``DataError`` naming the line and the field."""
    try:
        text = utf8_text(path.read_bytes())  # a UTF-8 byte order mark is dropped
    except NotUTF8 as e:
        raise DataError(
            f"cannot read QA file {path}: not UTF-8 text ({e}); the data files read are jsonl, "
            "a JSON list (UTF-8) and parquet (a .parquet name or PAR1 magic bytes)"
        ) from None
    except OSError as e:
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
                if _SURROGATE_ESCAPE.search(line):
                    check_strings(rows[-1][1], f"{path}, line {n}")
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
        start = pos
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise DataError(
                f"{path}, line {e.lineno}: invalid JSON: {e.msg} (column {e.colno})"
            ) from None
        rows.append((f"line {line}", value))
        if _SURROGATE_ESCAPE.search(text, start, pos):
            check_strings(value, f"{path}, line {line}")
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
    rows: list[tuple[str, Any]],
    where: str,
    format: str,
    source: str,
    max_question_chars: int | None = None,
    skipped: list[str] | None = None,
) -> list[QAExample]:
    if format == "auto":
        format = _detect(rows[0][1], f"{where}, {rows[0][0]}")
    elif format not in _PARSERS:
        raise DataError(
            f"unknown QA format {format!r}; choose 'auto' or one of {', '.join(FORMATS)}"
        )
    seen: dict[str, str] = {}
    out: list[QAExample] = []
    left_out: list[str] = []  # "<where>, <label>: question: N characters, over the bound of M"
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
        try:
            check_text(question, f"{where}, {label}: question", max_question_chars)
        except TextTooLong as e:  # a counted skip, as CER's over-long prompts
            left_out.append(str(e))
            continue
        out.append(QAExample(ex_id, question, golds, metadata))
    if left_out:
        log.warning(
            "%s: %d of %d rows skipped (first: %s)", where, len(left_out), len(rows), left_out[0]
        )
        if skipped is not None:
            skipped.extend(left_out)
        if not out:
            raise DataError(
                f"{where}: no row left: all {len(rows)} questions are over the bound "
                f"(first: {left_out[0]})"
            )
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


def title_key(title: str) -> str:
    """A supporting title as the evidence oracles compare it (``eviback.oracle``,
    ``arco.teacher.oracle_support``): stripped and casefolded."""
    return title.strip().casefold()


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
    try:
        check_text(question, "")
    except DataError as e:  # a lone surrogate (in a row given in memory, not as a list)
        raise _FieldError("question", str(e).removeprefix(": ")) from None
    return question


def _golds(row: dict[str, Any], key: str, required: bool = True) -> list[str]:
    """A gold answer or a list of them as a list of strings (numbers become their text by
    ``answer_text``).

    An optional field (MuSiQue's aliases) may be absent or an empty list.
    """
    value = _get(row, key, (str, int, float, list), required)
    answers = [] if value is None else value if isinstance(value, list) else [value]
    texts = []
    for i, a in enumerate(answers):
        name = f"{key}[{i}]" if isinstance(value, list) else key
        try:
            text = answer_text(a)
        except ValueError as e:
            raise _FieldError(name, f"bad answer: {e}") from None
        if not text.strip():
            raise _FieldError(name, f"bad answer {_show(a)}")
        texts.append(text)
    if not answers and required:
        raise _FieldError(key, "no answers")
    return texts


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
