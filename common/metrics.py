"""QA answer metrics: SQuAD normalisation, exact match, token F1 and cover exact match.

Each score is the maximum over the gold answers. A prediction that is None, empty, or normalises to
nothing (e.g. "the", ".") scores 0, so that a policy cannot earn reward with an empty answer.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_SPECIAL = frozenset({"yes", "no", "noanswer"})


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lowercase, drop punctuation, drop articles a/an/the, collapse spaces."""
    return " ".join(_ARTICLES.sub(" ", s.lower().translate(_PUNCTUATION)).split())


def exact_match(prediction: str | None, golds: str | Sequence[str]) -> float:
    """1.0 when the normalised prediction equals a normalised gold answer, else 0.0."""
    return _best(prediction, golds, lambda p, g: float(p == g))


def f1_score(prediction: str | None, golds: str | Sequence[str]) -> float:
    """Token F1 on normalised answers: F1 = 2PR / (P + R), with P = |p ∩ g| / |p| and
    R = |p ∩ g| / |g| over token multisets. When either side is yes, no or noanswer the two must be
    equal, else the score is 0 (a "no" must not earn credit against "no idea")."""
    return _best(prediction, golds, _token_f1)


def cover_exact_match(prediction: str | None, golds: str | Sequence[str]) -> float:
    """1.0 when a normalised gold answer occurs in the normalised prediction on token boundaries
    ("paris" covers "in paris france" but not "parisian"), else 0.0. An empty gold covers nothing."""
    return _best(prediction, golds, lambda p, g: float(bool(g) and f" {g} " in f" {p} "))


def _token_f1(pred: str, gold: str) -> float:
    if (pred in _SPECIAL or gold in _SPECIAL) and pred != gold:
        return 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _best(
    prediction: str | None, golds: str | Sequence[str], score: Callable[[str, str], float]
) -> float:
    golds = [golds] if isinstance(golds, str) else list(golds)
    if not golds:
        raise ValueError("no gold answers to score against")
    pred = normalize_answer(prediction) if prediction is not None else ""
    if not pred:
        return 0.0
    return max(score(pred, normalize_answer(g)) for g in golds)
