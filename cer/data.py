"""Math and multiple-choice examples for CER, and their loaders.

``load_math_examples(path, format="auto")`` reads a jsonl, JSON (a list, or one object a line) or
parquet file, or ``hf://owner/name[:config]@split`` from the hub, or takes the rows of a
``datasets.Dataset`` or a list of dicts in place of a file (named ``<Dataset>, row N`` or
``<list>, row N`` in errors; no source in the ids unless ``source`` is given). Formats, picked
from the keys of the first row when ``auto``:

- ``math``: the MATH train split ``{problem, level, type, solution}``; the gold is the last boxed
  answer of the solution. Rows whose solution has no box are left out and listed in
  ``Loaded.skipped`` (and logged), never dropped silently.
- ``answer``: MATH500 / AIME / AMC style ``{problem | question, answer}`` (a number answer is
  written as text by ``common.data.answer_text``, the QA loaders' rule: ``27.0`` as ``27``,
  ``1.5e3`` as ``1500``, ``0.25`` as ``0.25``; ``NaN``, ``Infinity`` and booleans are an error).
  An optional ``verifier: "alias"`` (the tiny alias task)
  makes ``answer_forms`` (a list starting with the answer) the row's correct answers
  (``cer.rewards.groups.is_correct``).
- ``webinstruct``: WebInstruct-verified ``{id, question, answer, answer_type, category,
  difficulty}``; ``webinstruct_paper_filter`` keeps the paper's subset.
- ``mmlu_pro``: ``{question, options, answer (letter) and/or answer_index}``.
- ``supergpqa``: ``{question, options, answer_letter}``.
- ``hotpotqa``: HotpotQA's own rows ``{_id, question, answer, supporting_facts, context}``, read as
  reading comprehension: the problem is the supporting paragraphs (``Title: text``, in context
  order) and ``Question: …``; the answer is a short phrase, written whole as the response
  (``metadata["short_answer"]``: ``cer.prompt`` asks for the answer only,
  ``cer.rewards.answer.response_split`` takes the whole response as solution and answer) and
  judged by SQuAD-normalised exact match (``metadata["verifier"] = "qa"``).

Multiple-choice problems render their options as ``A. …`` lines under the question; the gold is
the letter and ``metadata["multiple_choice"]`` is True. Every other key of a row is kept in
``metadata``. An example's id is ``"{source}:{row id}"`` (the row's 0-based index when it has
none); ``source`` defaults to the file's stem. A bad row is a ``DataError`` naming the file, the
line (or row) and the field; a string with a lone surrogate (``"\\ud800"``, which JSON reads but no
tokenizer takes) is one (``common.data.check_text``). ``max_chars`` (the prompt budget in
characters, ``common.data.question_char_limit``; ``load_problems`` gives it) leaves a longer problem
out as a counted skip in ``Loaded.skipped``, as over-long prompts are (``load_problems``).
"""

from __future__ import annotations

import logging
import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cer.rewards.answer import last_boxed
from common.data import (
    DataError,
    TextTooLong,
    answer_text,
    check_text,
    hub_rows,
    in_memory_rows,
    read_rows,
)

if TYPE_CHECKING:  # datasets is heavy: imported only where a hub split is loaded
    from datasets import Dataset

FORMATS = ("math", "answer", "webinstruct", "mmlu_pro", "supergpqa", "hotpotqa")
ROW_VERIFIERS = ("alias",)  # values of an answer row's optional "verifier" field
LETTERS = string.ascii_uppercase[:10]  # A-J: MMLU-Pro has up to 10 options
_HF_PATH = re.compile(r"hf://(?P<id>[^:@]+)(?::(?P<config>[^@]+))?@(?P<split>.+)")
_ID_KEYS = ("id", "_id", "unique_id", "question_id", "uuid", "idx")
log = logging.getLogger(__name__)


@dataclass
class MathExample:
    id: str
    problem: str
    answer: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Loaded:
    """The examples of a file, and ``"<where>: <why>"`` for each row left out."""

    examples: list[MathExample]
    skipped: list[str] = field(default_factory=list)


def load_math_examples(
    path: str | Path | Dataset | Sequence[Mapping[str, Any]],
    format: str = "auto",
    source: str | None = None,
    max_chars: int | None = None,
) -> Loaded:
    """Load a file (or ``hf://owner/name[:config]@split``, a ``datasets.Dataset``, a list of
    dicts) in one of ``FORMATS``; a problem over ``max_chars`` characters is skipped (counted in
    ``Loaded.skipped``)."""
    if format != "auto" and format not in FORMATS:
        raise DataError(f"unknown format {format!r}; known: auto, {', '.join(FORMATS)}")
    memory = in_memory_rows(path)
    match = None if memory is not None else _HF_PATH.fullmatch(str(path))
    if memory is not None:
        where, rows = memory
        source = "" if source is None else source
    elif match:
        rows, where = hub_rows(match["id"], match["config"], match["split"]), str(path)
        source = match["id"].rsplit("/", 1)[-1] if source is None else source
    elif str(path).startswith("hf://"):
        raise DataError(f"hub path {str(path)!r} is not of the form hf://owner/name[:config]@split")
    else:
        rows, where = read_rows(Path(path)), str(path)
        source = Path(path).stem if source is None else source
    if not rows:
        raise DataError(f"{where}: no rows")
    if format == "auto":
        format = _detect_format(rows[0][1], f"{where}, {rows[0][0]}")
    parse_row = _PARSERS[format]
    loaded = Loaded([])
    seen: dict[str, str] = {}  # id -> the label of the row that first had it
    for n, (label, row) in enumerate(rows):
        at = f"{where}, {label}"
        if not isinstance(row, dict):
            raise DataError(f"{at}: expected a JSON object, got {type(row).__name__}")
        raw_id = next((row[k] for k in _ID_KEYS if k in row), n)
        if str(raw_id) in seen:  # the rule of common.data: ids are unique within a file
            raise DataError(f"{at}: duplicate id {str(raw_id)!r} (first at {seen[str(raw_id)]})")
        seen[str(raw_id)] = label
        example = parse_row(row, at)
        if isinstance(example, str):
            loaded.skipped.append(f"{at}: {example}")
            continue
        try:
            check_text(example.problem, f"{at}: problem", max_chars)
        except TextTooLong as e:
            loaded.skipped.append(str(e))
            continue
        example.id = f"{source}:{raw_id}" if source else str(raw_id)
        loaded.examples.append(example)
    if loaded.skipped:
        log.warning(
            "%s: %d of %d rows skipped (first: %s)",
            where,
            len(loaded.skipped),
            len(rows),
            loaded.skipped[0],
        )
    return loaded


def webinstruct_paper_filter(examples: Sequence[MathExample]) -> list[MathExample]:
    """The paper's WebInstruct subset: ``category != "Mathematics"`` and ``difficulty ==
    "University"``."""
    return [
        ex
        for ex in examples
        if ex.metadata.get("category") != "Mathematics"
        and ex.metadata.get("difficulty") == "University"
    ]


def render_options(question: str, options: Sequence[str]) -> str:
    """The question followed by one ``A. option`` line per option."""
    return "\n".join([question, *(f"{LETTERS[i]}. {o}" for i, o in enumerate(options))])


def _detect_format(row: Any, at: str) -> str:
    keys = set(row) if isinstance(row, dict) else set()
    if "options" in keys:
        return "supergpqa" if "answer_letter" in keys else "mmlu_pro"
    if "answer_type" in keys:
        return "webinstruct"
    if "supporting_facts" in keys:
        return "hotpotqa"
    if "answer" in keys:
        return "answer"
    if "solution" in keys:
        return "math"
    raise DataError(
        f"{at}: cannot tell the format from the keys {sorted(keys)}; expected a MATH row "
        "(problem, solution), an answer row (problem or question, answer), WebInstruct "
        "(question, answer, answer_type, ...) or multiple choice (question, options, ...)"
    )


def _text(row: dict, key: str, at: str) -> str:
    if key not in row:
        raise DataError(f"{at}: missing field {key!r}")
    if not isinstance(row[key], str) or not row[key].strip():
        raise DataError(f"{at}: field {key!r} must be a non-empty string, got {row[key]!r}")
    return check_text(row[key], f"{at}: field {key!r}")  # a lone surrogate is no text


def _answer_text(row: dict, key: str, at: str) -> str:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        if key not in row:
            raise DataError(f"{at}: missing field {key!r}")
        raise DataError(f"{at}: field {key!r} must be a string or a number, got {value!r}")
    try:
        text = answer_text(value)
    except ValueError as e:  # NaN, Infinity
        raise DataError(f"{at}: field {key!r}: {e}") from None
    text = check_text(text, f"{at}: field {key!r}").strip()
    if not text:
        raise DataError(f"{at}: field {key!r} is empty")
    return text


def _rest(row: dict, *used: str) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in used and k not in _ID_KEYS}


def _parse_math(row: dict, at: str) -> MathExample | str:
    problem = _text(row, "problem", at)
    gold = last_boxed(_text(row, "solution", at))
    if gold is None or not gold.strip():
        return "no \\boxed{} answer in the solution"
    return MathExample("", problem, gold.strip(), _rest(row, "problem"))


def _parse_answer(row: dict, at: str) -> MathExample:
    key = "problem" if "problem" in row else "question"
    answer = _answer_text(row, "answer", at)
    if "verifier" in row:
        _check_verifier(row, answer, at)
    return MathExample("", _text(row, key, at), answer, _rest(row, key))


def _check_verifier(row: dict, answer: str, at: str) -> None:
    """A row's own verifier: only ``alias``, which needs ``answer_forms``, a list of non-empty
    strings whose first is the answer."""
    if row["verifier"] not in ROW_VERIFIERS:
        raise DataError(
            f"{at}: field 'verifier' must be one of {list(ROW_VERIFIERS)}, got {row['verifier']!r}"
        )
    forms = row.get("answer_forms")
    if not isinstance(forms, list) or not forms:
        raise DataError(f"{at}: verifier 'alias' needs field 'answer_forms', a non-empty list")
    if not all(isinstance(f, str) and f.strip() for f in forms):
        raise DataError(f"{at}: field 'answer_forms' must hold non-empty strings, got {forms!r}")
    if forms[0].strip() != answer:
        raise DataError(
            f"{at}: field 'answer_forms' must start with the answer {answer!r}, got {forms[0]!r}"
        )


def _parse_webinstruct(row: dict, at: str) -> MathExample:
    meta = {k: _text(row, k, at) for k in ("answer_type", "category", "difficulty")}
    return MathExample(
        "",
        _text(row, "question", at),
        _answer_text(row, "answer", at),
        {**_rest(row, "question", "answer"), **meta},
    )


def _options(row: dict, at: str) -> list[str]:
    options = row.get("options")
    if not isinstance(options, list) or not 1 <= len(options) <= len(LETTERS):
        raise DataError(f"{at}: field 'options' must be a list of 1 to {len(LETTERS)} options")
    return [str(o) for o in options]


def _letter(row: dict, key: str, n_options: int, at: str) -> str:
    letter = row[key].strip() if isinstance(row.get(key), str) else None
    if letter not in LETTERS[:n_options]:
        raise DataError(
            f"{at}: field {key!r} must be one of the {n_options} option letters, got {row.get(key)!r}"
        )
    return letter


def _multiple_choice(row: dict, at: str, letter: str, options: list[str]) -> MathExample:
    question = _text(row, "question", at)
    meta = {**_rest(row, "question"), "options": options, "multiple_choice": True}
    return MathExample("", render_options(question, options), letter, meta)


def _parse_mmlu_pro(row: dict, at: str) -> MathExample:
    options = _options(row, at)
    letter = _letter(row, "answer", len(options), at) if "answer" in row else None
    index = row.get("answer_index")
    if index is not None:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(options):
            raise DataError(f"{at}: field 'answer_index' must be an option index, got {index!r}")
        if letter is not None and letter != LETTERS[index]:
            raise DataError(
                f"{at}: field 'answer' ({letter}) disagrees with 'answer_index' ({index})"
            )
        letter = LETTERS[index]
    if letter is None:
        raise DataError(f"{at}: missing field 'answer' (letter) or 'answer_index'")
    return _multiple_choice(row, at, letter, options)


def _parse_supergpqa(row: dict, at: str) -> MathExample:
    options = _options(row, at)
    return _multiple_choice(row, at, _letter(row, "answer_letter", len(options), at), options)


def _parse_hotpotqa(row: dict, at: str) -> MathExample:
    question, answer = _text(row, "question", at), _answer_text(row, "answer", at)
    context, facts = row.get("context"), row.get("supporting_facts")
    if not isinstance(context, list) or not all(
        isinstance(c, list) and len(c) == 2 and isinstance(c[1], list) for c in context
    ):
        raise DataError(f"{at}: field 'context' must be a list of [title, [sentence, ...]]")
    if not isinstance(facts, list) or not all(isinstance(f, list) and f for f in facts):
        raise DataError(f"{at}: field 'supporting_facts' must be a list of [title, sentence]")
    support = {str(f[0]) for f in facts}
    paragraphs = [f"{t}: {''.join(map(str, s))}" for t, s in context if t in support]
    if not paragraphs:
        raise DataError(f"{at}: no paragraph of 'context' is named in 'supporting_facts'")
    problem = "\n\n".join([*paragraphs, f"Question: {question}"])
    meta = {
        **_rest(row, "question", "answer", "context", "supporting_facts"),
        "verifier": "qa",
        "short_answer": True,
    }
    return MathExample("", problem, answer, meta)


_PARSERS: dict[str, Callable[[dict, str], MathExample | str]] = {
    "math": _parse_math,
    "answer": _parse_answer,
    "webinstruct": _parse_webinstruct,
    "mmlu_pro": _parse_mmlu_pro,
    "supergpqa": _parse_supergpqa,
    "hotpotqa": _parse_hotpotqa,
}
