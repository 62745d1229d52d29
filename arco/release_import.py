"""The ARCO release's warmup data as this project's warmup collection (``warmup.teacher=file``):
the episodes and hindsight annotations the LLM teacher would give (``arco.warmup.collect_llm``),
read from the release's JSONL instead of paid for again. No request is sent.

The format is the release writer's (``src/training/warmup_collect.py``, ``_process_one_api`` and
its local/vLLM modes): one JSON line per ``(example_id, sample_idx)`` with ``example_id`` (the
HotpotQA ``_id``), ``sample_idx``, ``question``, ``gold_answer``, ``reward``, ``reward_info``,
``submitted_answer`` and ``steps[]``, each step with ``step``, ``action`` (the parsed
``Search[q]`` / ``Finish[a]``, or the raw text of an unparseable turn), ``observation`` (a
search's top-1 paragraph, joined from its sentences), ``criteria[K]``, ``scores[K]`` and, from
the modes that write them, ``valid_parse``, ``forced_finish`` and ``searches_remaining_before``.

A step becomes (``arco.steps.agent_step``, the one builder of steps):

    valid_parse false        "invalid" (this project's invalid-action explanation as observation)
    forced_finish true       the forced turn: "answer" for Finish[...], else "search"/"invalid"
                             (the release's "forced finish violation"), no documents
    Finish[...]              "answer"
    Search[...]              "search"; its document is the question's paragraph
                             (``metadata.paragraphs``) whose text is the observation, whitespace
                             ignored; the doc id is its position, as the distractor retriever's

A record is skipped, counted and printed (never silently) when its ``example_id`` is not an
``assets.train`` question (``unknown_question``; ``ambiguous_id`` when two sources share it), a
search's observation is none of the question's paragraphs (``unmatched_paragraph``), it has no
steps (``no_steps``), it repeats an ``(example_id, sample_idx)`` (``duplicate``), or it is over
the cap: the file's first ``questions`` questions in file order, each one's first ``samples``
records (``over_questions``, ``over_samples``). A malformed record, a step with other than
``rubric.k`` criteria or scores, or a budget that is not ``env.max_searches``'s is an error
naming file:line. R is the release's ``reward`` (the one its annotator decomposed).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arco.steps import Episode, agent_step, budget_before
from arco.teacher import INVALID_OBSERVATION, StepAnnotation
from common.data import QAExample
from common.jsonl import read_jsonl
from common.metrics import exact_match

SKIPS = (
    "unknown_question",
    "ambiguous_id",
    "unmatched_paragraph",
    "no_steps",
    "duplicate",
    "over_questions",
    "over_samples",
)


@dataclass
class ReleaseImport:
    """The imported episodes (file order) and their annotations, the counts (records, imported,
    each skip reason, correct, invalid_steps, forced_searches, reward_differs: the release's R
    is not this project's exact match of the answer), the first skipped line of each reason, and
    the ids of every ``assets.train`` question the file holds, imported or over the cap (never
    held out to choose π's epoch)."""

    episodes: list[Episode]
    annotations: list[list[StepAnnotation] | None]
    counts: dict[str, int]
    first_skip: dict[str, str] = field(default_factory=dict)
    question_ids: set[str] = field(default_factory=set)


def numbered_records(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """``common.jsonl.read_jsonl``'s records, each with its line number (blank lines skipped, a
    torn last line dropped with a warning)."""
    records = read_jsonl(path)
    lines = Path(path).read_bytes().split(b"\n")
    numbers = [i for i, raw in enumerate(lines, start=1) if raw.strip()]
    return list(zip(numbers, records, strict=False))


def _by_release_id(examples: Sequence[QAExample]) -> dict[str, QAExample | None]:
    """The release's ``example_id`` (HotpotQA ``_id``) -> the question: this project's id is
    ``<source>:<_id>`` (``common.data.load_qa``), or the bare id; None when two share it."""
    out: dict[str, QAExample | None] = {}
    for ex in examples:
        keys = {ex.id, ex.id.split(":", 1)[1]} if ":" in ex.id else {ex.id}
        for key in keys:
            out[key] = ex if key not in out or out[key] is ex else None
    return out


def _norm(text: str) -> str:
    return "".join(text.split())


def _check(cond: bool, where: str, problem: str) -> None:
    if not cond:
        raise ValueError(f"{where}: {problem} (the release's warmup format)")


def _annotation(step: dict, k: int, where: str) -> StepAnnotation | None:
    """The step's K criteria and scores; None when the release wrote another number of them (its
    parser kept 2-4 criteria, or none when the annotation did not parse, and padded the scores):
    the episode is kept for π and its annotation dropped for μ, counted as ``k_mismatch``, as an
    annotation that does not parse is in ``collect_llm``."""
    criteria, scores = step.get("criteria"), step.get("scores")
    _check(
        isinstance(criteria, list) and isinstance(scores, list), where, "criteria/scores not lists"
    )
    if len(criteria) != k or len(scores) != k:
        return None
    _check(all(isinstance(c, str) and c.strip() for c in criteria), where, "an empty criterion")
    finite = all(
        isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in scores
    )
    _check(finite, where, "a score that is not a finite number")
    return StepAnnotation([c.strip() for c in criteria], [float(x) for x in scores])


def import_release(
    path: str | Path,
    examples: Sequence[QAExample],
    k: int,
    max_searches: int,
    questions: int | None = None,
    samples: int | None = None,
) -> ReleaseImport:
    """The release's warmup records in ``path`` as episodes of ``examples`` (``assets.train``)
    and their annotations; see the module's docstring. Prints what it imported and skipped."""
    numbered = numbered_records(path)
    by_id = _by_release_id(examples)
    counts = {"records": len(numbered), "imported": 0, "k_mismatch": 0, **dict.fromkeys(SKIPS, 0)}
    counts.update(dict.fromkeys(("correct", "invalid_steps", "forced_searches"), 0))
    counts["reward_differs"] = 0
    result = ReleaseImport([], [], counts)
    seen: set[tuple[str, int]] = set()
    kept: Counter = Counter()  # question id -> records imported

    def skip(reason: str, where: str, why: str) -> None:
        counts[reason] += 1
        result.first_skip.setdefault(reason, f"{where}: {why}")

    for number, rec in numbered:
        where = f"{path}:{number}"
        for key in ("example_id", "steps", "reward"):
            _check(key in rec, where, f"no {key!r}")
        _check(isinstance(rec["steps"], list), where, "'steps' is not a list")
        reward = rec["reward"]
        _check(isinstance(reward, int | float) and not isinstance(reward, bool), where, "reward")
        sample = rec.get("sample_idx", 0)
        _check(isinstance(sample, int) and not isinstance(sample, bool), where, "sample_idx")
        release_id = str(rec["example_id"])
        ex = by_id.get(release_id)
        steps, notes, answer = [], [], rec.get("submitted_answer")
        unmatched = ""
        for t, s in enumerate(rec["steps"]):
            at = f"{where}: steps[{t}]"
            _check(isinstance(s, dict) and isinstance(s.get("action"), str), at, "no action")
            notes.append(_annotation(s, k, at))
            forced = bool(s.get("forced_finish", False))
            left = budget_before(t, max_searches, forced)
            stated = s.get("searches_remaining_before", left)
            if (
                stated != left
                or (forced and t != max_searches)
                or (not forced and t >= max_searches)
            ):
                raise ValueError(
                    f"{at}: searches remaining {stated}, forced finish {forced}; env.max_searches="
                    f"{max_searches} gives {left} at turn {t}: set env.max_searches to the "
                    "release's max_steps (3)"
                )
            action = s["action"].strip()
            if not s.get("valid_parse", True):
                kind, obs, docs = "invalid", INVALID_OBSERVATION, ()
            elif forced or action.startswith("Finish["):
                kind = "answer" if action.startswith("Finish[") else "invalid"
                kind = "search" if action.startswith("Search[") else kind
                obs, docs = "", ()
            elif action.startswith("Search["):
                kind, obs = "search", str(s.get("observation") or "")
                found = [] if ex is None else ex.metadata.get("paragraphs") or []
                hits = [
                    i for i, p in enumerate(found) if _norm(str(p.get("text", ""))) == _norm(obs)
                ]
                if not hits:
                    unmatched = unmatched or f"steps[{t}]'s observation {obs[:60]!r}"
                    continue
                obs, docs = found[hits[0]]["text"], (str(hits[0]),)
            else:  # the release's env raised on it: not an action
                kind, obs, docs = "invalid", INVALID_OBSERVATION, ()
            if kind == "answer" and answer is None:
                answer = action[len("Finish[") :].rstrip(")]").strip()
            steps.append(agent_step(kind, action, obs, left, forced, docs))
        if ex is None:
            reason = "unknown_question" if release_id not in by_id else "ambiguous_id"
            skip(reason, where, f"example_id {release_id!r} is not one assets.train question")
            continue
        result.question_ids.add(ex.id)
        if (ex.id, sample) in seen:
            skip("duplicate", where, f"a second record of ({release_id!r}, {sample})")
            continue
        seen.add((ex.id, sample))
        if unmatched:
            skip("unmatched_paragraph", where, f"{unmatched} is none of the question's paragraphs")
            continue
        if not steps:
            skip("no_steps", where, "no steps")
            continue
        if questions is not None and ex.id not in kept and len(kept) >= questions:
            skip("over_questions", where, f"past warmup.questions={questions}")
            continue
        if samples is not None and kept[ex.id] >= samples:
            skip("over_samples", where, f"past warmup.samples={samples}")
            continue
        kept[ex.id] += 1
        answer = None if answer is None else str(answer)
        metadata = {**ex.metadata, "sample": sample, "release_line": number}
        episode = Episode(
            ex.id, ex.question, list(ex.golden_answers), steps, answer, float(reward), metadata
        )
        result.episodes.append(episode)
        kept_notes = None if any(n is None for n in notes) else notes
        if kept_notes is None:  # printed with the skips: the first record and its numbers
            counts["k_mismatch"] += 1
            result.first_skip.setdefault(
                "k_mismatch",
                f"{where}: an annotated step without {k} criteria and scores "
                "(rubric.k; the release's file name says its _k<K>): kept for π, not for μ",
            )
        result.annotations.append(kept_notes)
        counts["imported"] += 1
        counts["correct"] += reward > 0.5
        counts["invalid_steps"] += sum(s.kind == "invalid" for s in steps)
        counts["forced_searches"] += sum(s.forced and s.kind == "search" for s in steps)
        em = float(exact_match(answer, ex.golden_answers)) if answer else 0.0
        counts["reward_differs"] += em != float(reward)
    skipped = ", ".join(
        f"{r} {counts[r]} (first: {result.first_skip[r]})" for r in result.first_skip
    )
    print(
        f"[arco warmup] {path}: imported {counts['imported']} of {counts['records']} records of "
        f"{len(kept)} questions, no request; skipped: {skipped or 'none'}",
        flush=True,
    )
    return result
