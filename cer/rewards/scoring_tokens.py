"""CER's ``tokens/reward``: the tokens its scorer forwards, counted from the pairs' lengths."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cer.rewards.scoring import ScoreFn, shared_trunks


def scoring_tokens(
    prefixes: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    generated: Sequence[Any] | None = None,
    whole: bool = False,
) -> int:
    """Real (unpadded) tokens one ``score_fn`` call forwards, as ``hf_prefix_scorer`` lays them
    out: a prefix with a generation cache, its continuations alone; the other prefixes cut by
    ``shared_trunks``, each trunk once and each prefix's own suffix once; every continuation
    once. ``whole``: every pair whole (the engine's ``score``). Pairs without a continuation
    are not forwarded."""
    if whole:
        return sum(len(p) + len(c) for p, c in zip(prefixes, continuations, strict=True) if c)
    distinct: dict[tuple[int, ...], int] = {}
    with_pairs: set[int] = set()
    cached: set[int] = set()
    tokens = 0
    for i, (p, c) in enumerate(zip(prefixes, continuations, strict=True)):
        m = distinct.setdefault(tuple(p), len(distinct))
        if c:
            with_pairs.add(m)
            tokens += len(c)
            if generated is not None and generated[i] is not None:
                cached.add(m)
    keys = list(distinct)
    rest = [m for m in range(len(keys)) if m not in cached]
    for t in shared_trunks([keys[m] for m in rest]):
        members = [rest[k] for k in t.members if rest[k] in with_pairs]
        if members:
            tokens += t.length + sum(len(keys[m]) - t.length for m in members)
    return tokens


class CountingScorer:
    """``score_fn``, counting the tokens each call forwards (``scoring_tokens``; ``whole``: as
    the engine's ``score`` lays them out); ``take()`` returns the count since the last take."""

    def __init__(self, score_fn: ScoreFn, whole: bool = False) -> None:
        self.score_fn, self.whole, self.tokens = score_fn, whole, 0

    def __call__(self, prefixes, continuations, last_alternatives=None, generated=None):
        self.tokens += scoring_tokens(prefixes, continuations, generated, self.whole)
        return self.score_fn(prefixes, continuations, last_alternatives, generated)

    def take(self) -> int:
        tokens, self.tokens = self.tokens, 0
        return tokens
