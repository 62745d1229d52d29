"""Answer verifiers: exact (normalised string), rule (math-verify), multiple-choice letter and the
alias oracle (any of a row's listed answer forms); and the public release's two checks: math-verify
on the last 512 characters of the response (no box needed) and strict multiple-choice equality.

Each takes the extracted answer string (the release's math check: the response) and the gold and
returns a bool; none ever raises on malformed input (a model writes anything).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence

from math_verify import parse, verify
from math_verify.errors import TimeoutException

RULE_TIMEOUT_S = 5
RELEASE_TAIL_CHARS = 512  # the release's math check reads the response's last 512 characters
_DOLLARS = re.compile(r"^\$+|\$+$")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|boxed)\{(.*)\}", re.DOTALL)
_LATEX_SPACING = re.compile(r"\\[,!;: ]|\\left|\\right|\s+")
_DIGIT_COMMA = re.compile(r"(?<=\d),(?=\d)")
_LETTER = re.compile(r"\(([A-J])\)|([A-J])(?:[.):]|$)")

# math-verify logs a warning for each expression it cannot parse; a model writes many of those.
logging.getLogger("math_verify").setLevel(logging.ERROR)


def normalize_answer(answer: str) -> str:
    """The form compared by ``exact_verifier``: ``$`` delimiters, ``\\text{…}`` and similar
    wrappers, LaTeX spacing commands, ``\\left``/``\\right`` and all whitespace removed;
    ``\\dfrac``/``\\tfrac`` read as ``\\frac``; a trailing period dropped. Case is kept."""
    s = _DOLLARS.sub("", answer.strip()).strip()
    while m := _TEXT_WRAPPER.fullmatch(s):
        s = m[1].strip()
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    return _LATEX_SPACING.sub("", s).rstrip(".")


def exact_verifier(answer: str, gold: str) -> bool:
    """Normalised string equality (``normalize_answer``): ``0.5`` and ``\\frac{1}{2}`` differ."""
    return normalize_answer(answer) == normalize_answer(gold)


def rule_verifier(answer: str, gold: str) -> bool:
    """math-verify equivalence: ``verify(parse(gold), parse(answer))``, gold first.

    Both strings are wrapped in ``\\boxed{…}`` (after dropping ``$`` delimiters) so that
    math-verify reads them whole. In the main thread parsing and comparison are limited to
    ``RULE_TIMEOUT_S`` seconds each; math-verify's limit works by SIGALRM, which only the main
    thread can use, so in other threads it runs without one. Any failure (unparsable input,
    time-out, an error inside sympy) counts as not verified.
    """
    return _math_verify(_boxed(gold), _boxed(answer))


def release_rule_verifier(response: str, gold: str) -> bool:
    """The release's rule check: math-verify on the last ``RELEASE_TAIL_CHARS`` characters of the
    whole response (math-verify's own extraction: the last boxed or ``$…$`` expression, or a bare
    number; no box required), gold first. Limits and failures as in ``rule_verifier``."""
    return _math_verify(_boxed(gold), response[-RELEASE_TAIL_CHARS:])


def _math_verify(gold_text: str, answer_text: str) -> bool:
    timeout = RULE_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    try:
        gold_parsed = parse(gold_text, parsing_timeout=timeout)
        answer_parsed = parse(answer_text, parsing_timeout=timeout)
        if not gold_parsed or not answer_parsed:
            return False
        return bool(verify(gold_parsed, answer_parsed, timeout_seconds=timeout))
    except (Exception, TimeoutException):  # TimeoutException derives from BaseException
        return False


def _boxed(text: str) -> str:
    return "\\boxed{" + _DOLLARS.sub("", text.strip()).strip() + "}"


def extract_letter(answer: str) -> str | None:
    """The choice letter A-J an answer names: ``B``, ``(B)``, ``B.``, ``B. text``, ``B)``,
    ``\\text{B}``, ``$\\textbf{(B)}$``; None when it names none."""
    s = _DOLLARS.sub("", answer.strip()).strip()
    while m := _TEXT_WRAPPER.fullmatch(s):
        s = _DOLLARS.sub("", m[1].strip()).strip()
    m = _LETTER.match(s)
    return None if m is None else m[1] or m[2]


def letter_verifier(answer: str, gold_letter: str) -> bool:
    """Multiple choice: the answer's letter equals the gold letter (``gold_letter`` as written in
    the data, e.g. ``"C"``)."""
    letter = extract_letter(answer)
    return letter is not None and letter == gold_letter.strip().upper()


def strict_choice_verifier(answer: str, gold_letter: str) -> bool:
    """The release's multiple-choice check: the boxed answer is the gold letter itself (surrounding
    whitespace aside); ``(B)``, ``B.`` or ``\\text{B}`` do not count."""
    return answer.strip() == gold_letter.strip()


def normalize_alias(answer: str) -> str:
    """The form compared by ``alias_verifier``: ``$`` delimiters and ``\\text{…}``-style wrappers
    dropped, a trailing period dropped, case folded, runs of whitespace made one space, and
    commas between digits removed (``2,795,000`` reads as ``2795000``)."""
    s = _DOLLARS.sub("", answer.strip().rstrip(".")).strip()
    while m := _TEXT_WRAPPER.fullmatch(s):
        s = _DOLLARS.sub("", m[1].strip()).strip()
    s = " ".join(s.rstrip(".").split()).casefold()
    return _DIGIT_COMMA.sub("", s)


def alias_verifier(answer: str, forms: Sequence[str]) -> bool:
    """The alias oracle: the answer equals one of ``forms`` (every correct surface form of the
    gold, e.g. ``["Tusha Shusti", "Shusti"]`` or ``["2", "two"]``) after ``normalize_alias``.
    Nothing else is inferred: a given name alone (``Tusha``), a misspelling or ``2.0`` is wrong."""
    said = normalize_alias(answer)
    return bool(said) and any(said == normalize_alias(f) for f in forms)
