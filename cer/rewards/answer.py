"""Split a sampled response into its solution and its final ``\\boxed{…}`` answer, on token ids.

The answer is the content of the last box opener (``\\boxed{``, ``\\fbox{``, or the space form
``\\boxed 5``, whose answer runs to the next whitespace or ``$``). Only the last opener counts: when
it does not form a complete box (braces never closed: the answer was cut off), the response has no
answer. Braces are matched by depth; an escaped character (``\\{``, ``\\}``, ``\\\\``) is skipped.

On token ids (the sampled response, never re-tokenized): the response is decoded once,
incrementally, which gives each token's character span. Tokens are grouped into *emission groups*:
a run of tokens ending with one that completes its text (a multi-byte character can span several
byte-level tokens; those tokens share the span of the character they complete). Then:

- ``solution_ids``: the tokens of every group that ends at or before the character where the
  answer starts.
- ``tail``: the text from the end of the solution to the answer start. It is ``""`` when a token
  ends exactly after ``{``. It is non-empty when a token straddles the boundary (a BPE token
  ``"{1"``, or ``" 5"`` in the space form): that token cannot be split, so it is left out of the
  solution and its text before the answer is carried in the tail.
- the scored continuation for any answer string ``x`` (the sample's own, another sample's, the
  reference) is ``encode(tail + x + closing)``, re-encoded on its own: the same convention for every
  answer scored after one solution, so that they compete on equal terms. ``closing`` is ``"}"`` for
  the brace forms (so that ``pi("1" | s)`` is the probability of the answer "1" and not of every
  answer starting with "1"), the terminating character for the space form (``""`` when the text
  ends there). When the continuation's last token ends with the closing (``"}"`` alone, or
  ``"}}"`` merged with the answer's last brace), the last step sums the probability of every token
  that starts with that token's text (``closing_alternatives``): a model that writes ``"}."`` or
  ``"}}\\n"`` in one token has closed the box just as well.

An empty box (``\\boxed{}``) is no answer (``answer=None``, reward 0), but its solution is cut
at the box like any other.

A response without a box still serves as a solution (``solution_split``): all of its text, with the
tokens after the last visible character (end-of-turn and other special tokens) left out, and
``tail = "\\boxed{"``, so that its scored continuations are ``"\\boxed{" + x + "}"``.

A short-answer response (reading comprehension: the prompt asks for the answer only) has no
solution apart from its answer (``short_answer_split``): the solution is its visible tokens
followed by the tokens of ``"\\nThe answer is:"`` (a bridge the model did not sample), its
stripped text (a final period dropped) is the answer, and an answer x is scored as ``" " + x``
and the end-of-turn token (the tokenizer's ``eos_token``, ``"\\n"`` without one): the answer
said whole, then the turn's end, the model's most likely token after a restated answer. CER's
π(a* | s_k) is then how likely the model finds the reference once it has read its own answer:
high for an answer that holds the reference ("John André, a British officer" for "John
André"), which exact match misses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

BOX_OPEN = "\\boxed{"
_OPENER = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_BRACE = re.compile(r"[ \t]*\{")
_SPACE_ANSWER_END = re.compile(r"[\s$]")


@dataclass(frozen=True)
class BoxSpan:
    """Character positions of a box: answer in ``[answer_start, answer_end)``, closing text in
    ``[answer_end, closing_end)``."""

    answer_start: int
    answer_end: int
    closing_end: int


@dataclass(frozen=True)
class AnswerSplit:
    """A response cut into solution ids, the answer, and what a scored continuation wraps it in.

    ``answer`` is None for a response without a box or with an empty one. ``answer_ids`` and ``closing_ids`` are the
    sampled tokens whose text overlaps the answer and the closing text (a token that also holds
    neighbouring text is included whole).
    """

    solution_ids: list[int]
    tail: str
    answer: str | None
    answer_ids: list[int]
    closing: str
    closing_ids: list[int]

    def continuation_text(self, answer: str) -> str:
        """The text scored after ``solution_ids`` for ``answer``: tail + answer + closing."""
        return self.tail + answer + self.closing


def find_last_box(text: str) -> BoxSpan | None:
    """The span of the last box in ``text``, or None (no opener, or the last one is incomplete)."""
    openers = list(_OPENER.finditer(text))
    if not openers:
        return None
    pos = openers[-1].end()
    brace = _BRACE.match(text, pos)
    if brace:
        start = brace.end()
        end = _matching_brace(text, start)
        return None if end is None else BoxSpan(start, end, end + 1)
    if not text.startswith(" ", pos):
        return None
    start = len(text) - len(text[pos:].lstrip(" "))
    stop = _SPACE_ANSWER_END.search(text, start)
    end = stop.start() if stop else len(text)
    if end == start:
        return None
    return BoxSpan(start, end, min(end + 1, len(text)))


def _matching_brace(text: str, start: int) -> int | None:
    """Index of the ``}`` closing the group opened just before ``start``; escapes are skipped."""
    depth, i = 1, start
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """The content of the last box of ``text`` (gold extraction from MATH solutions), or None."""
    span = find_last_box(text)
    return None if span is None else text[span.answer_start : span.answer_end]


def backend_tokenizer(tokenizer: Any) -> Tokenizer:
    """The ``tokenizers.Tokenizer`` behind a fast HF tokenizer (or the tokenizer itself)."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not isinstance(backend, Tokenizer):
        raise TypeError(
            f"CER answer splitting needs a fast tokenizer (tokenizers.Tokenizer behind it); "
            f"got {type(tokenizer).__name__}"
        )
    return backend


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` alone, with no special tokens added."""
    return backend_tokenizer(tokenizer).encode(text, add_special_tokens=False).ids


def emission_groups(ids: list[int], tokenizer: Any) -> tuple[str, list[tuple[int, int, int, int]]]:
    """Decode ``ids`` once, incrementally; return the text (special tokens skipped) and the groups
    ``(first_token, end_token, char_start, char_end)``: tokens ``[first_token, end_token)`` decode
    to ``text[char_start:char_end]``. A special token is a group of width 0; tokens still waiting
    for the rest of a character at the end form a last group of width 0.
    """
    backend = backend_tokenizer(tokenizer)
    special = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
    stream = DecodeStream(skip_special_tokens=True)
    pieces: list[str] = []
    groups: list[tuple[int, int, int, int]] = []
    first, length = 0, 0
    for i, tok in enumerate(ids):
        chunk = stream.step(backend, tok)
        if chunk is None and not (tok in special and first == i):
            continue  # part of a character the next tokens complete
        chunk = chunk or ""
        pieces.append(chunk)
        groups.append((first, i + 1, length, length + len(chunk)))
        first, length = i + 1, length + len(chunk)
    if first < len(ids):
        groups.append((first, len(ids), length, length))
    return "".join(pieces), groups


def split_answer(response_ids: list[int], tokenizer: Any) -> AnswerSplit | None:
    """Split a sampled response at its last box (see the module docstring); None without a box."""
    text, groups = emission_groups(response_ids, tokenizer)
    return _split_at_box(response_ids, text, groups)


def solution_split(response_ids: list[int], tokenizer: Any) -> AnswerSplit:
    """``split_answer``, or for a response without a box: the whole visible response as the
    solution, ``answer=None`` and ``tail="\\boxed{"``."""
    text, groups = emission_groups(response_ids, tokenizer)
    split = _split_at_box(response_ids, text, groups)
    if split is not None:
        return split
    visible_end = max((g[1] for g in groups if g[3] > g[2]), default=0)
    return AnswerSplit(
        solution_ids=list(response_ids[:visible_end]),
        tail=BOX_OPEN,
        answer=None,
        answer_ids=[],
        closing="}",
        closing_ids=[],
    )


SHORT_BRIDGE, SHORT_TAIL = "\nThe answer is:", " "


def short_answer_split(response_ids: list[int], tokenizer: Any) -> AnswerSplit:
    """A short-answer response as its own solution and answer (module docstring); ``answer`` is
    None for a response with no visible text."""
    text, groups = emission_groups(response_ids, tokenizer)
    visible = list(response_ids[: max((g[1] for g in groups if g[3] > g[2]), default=0)])
    answer = text.strip().removesuffix(".").strip()
    return AnswerSplit(
        solution_ids=visible + encode_text(tokenizer, SHORT_BRIDGE),
        tail=SHORT_TAIL,
        answer=answer or None,
        answer_ids=visible,
        closing=getattr(tokenizer, "eos_token", None) or "\n",
        closing_ids=[],
    )


def response_split(response_ids: list[int], tokenizer: Any, short_answer: bool) -> AnswerSplit:
    """``short_answer_split`` for a short-answer row's response, else ``solution_split``."""
    split = short_answer_split if short_answer else solution_split
    return split(response_ids, tokenizer)


def _split_at_box(
    ids: list[int], text: str, groups: list[tuple[int, int, int, int]]
) -> AnswerSplit | None:
    span = find_last_box(text)
    if span is None:
        return None
    # Some text (the closing brace, or a non-empty space-form answer) follows answer_start, so a
    # group ending after it exists; its tokens and all later ones are left out of the solution.
    cut = next(g for g in groups if g[3] > span.answer_start)

    def overlapping(lo: int, hi: int) -> list[int]:
        return [t for g in groups if g[2] < hi and g[3] > lo for t in ids[g[0] : g[1]]]

    answer = text[span.answer_start : span.answer_end]
    return AnswerSplit(
        solution_ids=list(ids[: cut[0]]),
        tail=text[cut[2] : span.answer_start],
        # An empty box (``\\boxed{}``, ``\\boxed{ }``) is no answer: reward 0, as in the release.
        answer=answer if answer.strip() else None,
        answer_ids=overlapping(span.answer_start, span.answer_end),
        closing=text[span.answer_end : span.closing_end],
        closing_ids=overlapping(span.answer_end, span.closing_end),
    )


def continuation_ids(split: AnswerSplit, answer: str, tokenizer: Any) -> list[int]:
    """Token ids scored after ``split.solution_ids`` for ``answer``: encode(tail + answer +
    closing)."""
    return encode_text(tokenizer, split.continuation_text(answer))


# id of the backend tokenizer -> (the backend, kept alive so that its id is not reused; each
# token's text, "" for special tokens)
_TOKEN_TEXTS: dict[int, tuple[Tokenizer, list[str]]] = {}
_STARTING_WITH: dict[tuple[int, str], tuple[int, ...]] = {}


def _token_texts(backend: Tokenizer) -> list[str]:
    if id(backend) not in _TOKEN_TEXTS:
        special = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
        texts = [
            "" if i in special else backend.decode([i])
            for i in range(backend.get_vocab_size(with_added_tokens=True))
        ]
        _TOKEN_TEXTS[id(backend)] = (backend, texts)
    return _TOKEN_TEXTS[id(backend)][1]


def tokens_starting_with(tokenizer: Any, text: str) -> tuple[int, ...]:
    """Ids of every vocabulary token whose text starts with ``text`` (special tokens excluded);
    the vocabulary is decoded once per tokenizer, each text's set computed once."""
    if not text:
        raise ValueError("tokens_starting_with: empty text")
    backend = backend_tokenizer(tokenizer)
    texts = _token_texts(backend)
    key = (id(backend), text)
    if key not in _STARTING_WITH:
        _STARTING_WITH[key] = tuple(i for i, t in enumerate(texts) if t.startswith(text))
    return _STARTING_WITH[key]


def closing_alternatives(
    split: AnswerSplit, continuation: list[int], tokenizer: Any
) -> tuple[int, ...] | None:
    """The tokens that close the answer as well as the continuation's last one does, or None.

    When the continuation's last token ends with the closing text (``"}"`` alone, or merged with
    the answer's last characters: ``"}}"`` after ``\\frac{1}{2}``, ``")}"`` after ``(A)``, in
    Qwen's tokenizer), any token that starts with that token's text (``"}."``, ``"}$"``,
    ``"}}\\n"``, ``")}."``, ...) writes the same answer and closes it the same way: the answer's
    probability sums over them. Without a closing text the continuation is scored as it is.
    """
    if not split.closing or not continuation:
        return None
    last = backend_tokenizer(tokenizer).decode([continuation[-1]])
    if not last.endswith(split.closing):
        return None
    return tokens_starting_with(tokenizer, last)
