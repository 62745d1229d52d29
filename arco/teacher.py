"""ARCO's warmup teacher: teacher trajectories, hindsight annotation, and the tiny world's oracle.

1. A cheap teacher LLM plays the policy in the ReAct format (``teacher_rollouts``).
2. A strong LLM annotates each finished trajectory in hindsight: for every step K criteria and K
   scores in [-1, 1] with sum_t mean_k score_{t,k} = R (``annotate``); ``arco.projection`` then
   makes the scores meet the constraint exactly.

Both are any OpenAI-compatible endpoint behind ``common.llm_client.LLMClient``. Where the data
names its supporting documents (the tiny world by id, HotpotQA by title) the project is its own
annotator: ``oracle_annotation`` knows which searches found a supporting document and whether the
answer is right (``oracle_support``: what it compares).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from arco.projection import project_scores
from arco.rubric_prompt import strip_thinking
from arco.steps import AgentStep, Episode, agent_step, budget_before
from common.api_budget import RequestGroup, messages_chars
from common.data import QAExample, title_key
from common.llm_client import LLMClient
from common.metrics import exact_match
from common.rollout.protocols import ReActProtocol
from common.rollout.trajectory import Trajectory

Messages = list[dict[str, str]]
Search = Callable[[QAExample, str], tuple[str, tuple[str, ...]]]

# the explanation the policy's ReAct environment gives after an invalid turn (its frame left out)
INVALID_OBSERVATION = ReActProtocol().invalid_observation()[1]
FAILURES = ("unparseable", "wrong_step_count", "wrong_k", "request_failed")

# --- 1. the teacher plays the policy ----------------------------------------------------------

POLICY_SYSTEM = (
    "You are a search agent answering a multi-hop question. Take one action per turn, "
    "optionally after a short thought:\n"
    "Thought: <your reasoning>\n"
    "Action: Search[query]   (returns one document)\n"
    "or\n"
    "Action: Finish[answer]  (ends the episode; give a short exact answer)\n"
    "Every turn, an invalid one too, uses one unit of the search budget; once none remains you "
    "must finish with an answer."
)

_ACTION = re.compile(r"\b(search|finish)\[", re.IGNORECASE)


def _read_action(text: str) -> tuple[str, str | None, str]:
    """(kind, argument, the text up to the end of the action). The action is the first
    ``Search[`` or ``Finish[``; the last ``]`` on its line closes it."""
    text = strip_thinking(text).strip()
    m = _ACTION.search(text)
    if m is None:
        return "invalid", None, text
    line_end = text.find("\n", m.end())
    line = text[m.end() : len(text) if line_end < 0 else line_end]
    close = line.rfind("]")
    arg = line[:close].strip() if close >= 0 else ""
    if not arg:
        return "invalid", None, text
    kind = "search" if m.group(1).lower() == "search" else "answer"
    return kind, arg, text[: m.end() + close + 1]


def parse_teacher_action(text: str) -> tuple[str, str | None]:
    """("search", query) | ("answer", answer) | ("invalid", None) from a ReAct turn.

    Brackets and parentheses inside the argument are kept: ``Search[Foo (film)]`` gives
    "Foo (film)", ``Search[a [b] c]`` gives "a [b] c". An empty argument is invalid.
    """
    kind, arg, _ = _read_action(text)
    return kind, arg


def teacher_policy_messages(
    question: str, steps_so_far: Sequence[AgentStep], searches_left: int
) -> Messages:
    """The [system, user] messages asking the teacher for its next ReAct action."""
    history = []
    for step in steps_so_far:
        history.append(step.action)
        if step.observation:
            history.append(f"Observation: {step.observation}")
    request = (
        "No searches remain: answer now with Finish[answer]."
        if searches_left <= 0
        else "Your next action:"
    )
    user = (
        f"Question: {question.strip()}\n\n"
        f"Trajectory so far:\n{chr(10).join(history) or '(none)'}\n\n"
        f"Searches remaining: {max(searches_left, 0)}\n{request}"
    )
    return [{"role": "system", "content": POLICY_SYSTEM}, {"role": "user", "content": user}]


@dataclass
class _Rollout:
    example: QAExample
    sample: int
    steps: list[AgentStep] = field(default_factory=list)
    answer: str | None = None
    done: bool = False
    failed: bool = False


def teacher_rollouts(
    client: LLMClient,
    examples: Sequence[QAExample],
    search: Search,
    samples: int,
    max_searches: int = 3,
    cache_tag: str = "",
) -> tuple[list[Episode], dict[str, int]]:
    """``samples`` teacher episodes per example; ``search(example, query)`` gives (observation,
    doc ids).

    Each turn costs one unit of budget, an invalid one too (it gets ``INVALID_OBSERVATION``);
    after ``max_searches`` turns comes a forced-finish turn, where anything but an answer ends the
    episode with R = 0. R = exact match of the answer. A turn's live episodes of one sample index
    go out in one ``chat_many`` whose cache tag carries that index, so samples of a question
    differ and a rerun replays them. A failed request drops its episode (counted, never raised).
    Episodes come back in example order, then sample order.
    """
    rollouts = [_Rollout(ex, s) for ex in examples for s in range(samples)]
    counts = dict.fromkeys(
        ("finished", "correct", "request_failed", "invalid_steps", "forced_searches"), 0
    )
    for turn in range(max_searches + 1):
        forced = turn == max_searches
        searches_left = budget_before(turn, max_searches, forced)
        for s in range(samples):
            live = [r for r in rollouts if r.sample == s and not r.done]
            if not live:
                continue
            batch = [
                teacher_policy_messages(r.example.question, r.steps, searches_left) for r in live
            ]
            results = client.chat_many(batch, cache_tag=f"{cache_tag}|sample={s}")
            for r, result in zip(live, results, strict=True):
                if result.error is not None or result.text is None:
                    r.done = r.failed = True
                    counts["request_failed"] += 1
                    continue
                kind, arg, action = _read_action(result.text)
                observation, doc_ids = "", ()
                if kind == "answer":
                    r.answer, r.done = arg, True
                elif forced:
                    r.done = True
                    counts["forced_searches"] += kind == "search"
                elif kind == "search":
                    observation, doc_ids = search(r.example, arg)
                else:
                    observation = INVALID_OBSERVATION
                counts["invalid_steps"] += kind == "invalid"
                r.steps.append(
                    agent_step(kind, action, observation, searches_left, forced, tuple(doc_ids))
                )
    episodes = []
    for r in rollouts:
        if r.failed:
            continue
        ex = r.example
        reward = float(exact_match(r.answer, ex.golden_answers)) if r.answer else 0.0
        metadata = {**ex.metadata, "sample": r.sample}
        episodes.append(
            Episode(
                ex.id, ex.question, list(ex.golden_answers), r.steps, r.answer, reward, metadata
            )
        )
        counts["correct"] += reward > 0.5
    counts["finished"] = len(episodes)
    return episodes, counts


# --- 2. hindsight annotation ------------------------------------------------------------------


@dataclass
class StepAnnotation:
    criteria: list[str]
    scores: list[float]


@dataclass
class AnnotationResult:
    """One entry per episode (None: dropped), counts by outcome ("ok" or a ``FAILURES`` reason),
    and the client's usage totals after the call."""

    annotations: list[list[StepAnnotation] | None]
    counts: dict[str, int]
    usage: dict = field(default_factory=dict)


ANNOTATION_SYSTEM = (
    "You annotate a finished trajectory of a search agent in hindsight. The agent answers a "
    "multi-hop question with one action per turn: Search[query] returns a document, "
    "Finish[answer] ends the episode. Every turn, an invalid one too, uses one unit of the search "
    "budget; once none remains the agent must finish (a forced-finish turn), and a search there "
    "ends the episode with reward 0. The final reward R is 1 when the answer is exactly right, "
    "else 0.\n\n"
    "For every step write {k} short criteria, each a phrase naming what a good action at that "
    "point should achieve (query targeting, planning, evidence gathering, answer readiness, "
    "avoiding redundant searches), and score the step's action against each criterion in "
    "[-1, 1]:\n"
    "+0.7 to +1: rare, decisive for the outcome\n"
    "+0.2 to +0.6: helpful\n"
    "0: neutral\n"
    "-0.2 to -0.6: wasteful\n"
    "-0.7 to -1: causes a wrong answer or a budget violation\n"
    "Constraint: the step means must add up to the reward, sum_t mean_k score[t][k] = R.\n\n"
    "Reply with JSON only, one object per step in order, each with exactly {k} criteria and "
    "{k} scores: {example}"
)


def annotation_messages(episode: Episode, k: int) -> Messages:
    """The [system, user] messages asking a strong LLM for the hindsight annotation of
    ``episode``: K criteria and K scores per step with sum_t mean_k score_{t,k} = R."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    example = json.dumps([{"step": 1, "criteria": ["..."] * k, "scores": [0.0] * k}])
    yes_no = ("no", "yes")
    lines = [f"Question: {episode.question.strip()}", ""]
    for t, step in enumerate(episode.steps, 1):
        lines.append(
            f"Step {t} | searches remaining: {step.searches_left} | "
            f"forced finish: {yes_no[step.forced]} | invalid: {yes_no[step.kind == 'invalid']}"
        )
        lines.append(f"Action: {step.action}")
        lines.append(f"Observation: {step.observation or '(none)'}")
    n, reward = len(episode.steps), f"{episode.reward:g}"
    lines += [
        "",
        f"Final answer: {episode.answer if episode.answer is not None else '(none)'}",
        f"Final reward R = {reward}",
        "",
        f"Write {k} criteria and {k} scores for each of the {n} steps (step 1 to {n}); the "
        f"{n} step means must add up to R = {reward}.",
    ]
    return [
        {"role": "system", "content": ANNOTATION_SYSTEM.format(k=k, example=example)},
        {"role": "user", "content": "\n".join(lines)},
    ]


def _first_list_of_objects(text: str) -> list | None:
    decoder = json.JSONDecoder()
    for m in re.finditer(r"\[", text):
        try:
            obj, _ = decoder.raw_decode(text, m.start())
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, list) and obj and all(isinstance(o, dict) for o in obj):
            return obj
    return None


def _finite(x: object) -> bool:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an int beyond float range
        return False


def parse_annotation(text: str, n_steps: int, k: int) -> tuple[list[StepAnnotation] | None, str]:
    """(annotations sorted by step, "ok") or (None, reason). Never raises.

    Think blocks are dropped; the first JSON list of objects counts, whatever surrounds it (code
    fences, prose). Reasons: "unparseable" (no such list, or an object without an integer
    "step", "criteria" or "scores"), "wrong_step_count" (steps not exactly 0..n-1 or 1..n),
    "wrong_k" (not exactly k non-empty string criteria and k finite numeric scores).
    """
    if not isinstance(text, str):
        return None, "unparseable"
    items = _first_list_of_objects(strip_thinking(text))
    if items is None:
        return None, "unparseable"
    for item in items:
        step = item.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            return None, "unparseable"
        if "criteria" not in item or "scores" not in item:
            return None, "unparseable"
    steps = sorted(item["step"] for item in items)
    if steps not in (list(range(n_steps)), list(range(1, n_steps + 1))):
        return None, "wrong_step_count"
    annotations = []
    for item in sorted(items, key=lambda o: o["step"]):
        criteria, scores = item["criteria"], item["scores"]
        if not (isinstance(criteria, list) and isinstance(scores, list)):
            return None, "wrong_k"
        if len(criteria) != k or not all(isinstance(c, str) and c.strip() for c in criteria):
            return None, "wrong_k"
        if len(scores) != k or not all(_finite(x) for x in scores):
            return None, "wrong_k"
        annotations.append(
            StepAnnotation([c.strip() for c in criteria], [float(x) for x in scores])
        )
    return annotations, "ok"


def annotate(client: LLMClient, episodes: Sequence[Episode], k: int) -> AnnotationResult:
    """Hindsight annotations of ``episodes``, all prompts in one ``chat_many`` (sampling as the
    client is set). Failed requests and unusable answers are dropped (None) and counted."""
    results = client.chat_many([annotation_messages(e, k) for e in episodes])
    counts = dict.fromkeys(("ok", *FAILURES), 0)
    annotations: list[list[StepAnnotation] | None] = []
    for episode, result in zip(episodes, results, strict=True):
        if result.error is not None or result.text is None:
            parsed, reason = None, "request_failed"
        else:
            parsed, reason = parse_annotation(result.text, len(episode.steps), k)
        counts[reason] += 1
        annotations.append(parsed)
    return AnnotationResult(annotations, counts, client.stats.as_dict())


# --- what the LLM warmup will cost -------------------------------------------------------------

PLAYER_MAX_TOKENS = 64  # a ReAct turn
ANNOTATOR_TOKENS_PER_STEP = 128  # the annotator's max_tokens: this many a step of the longest play


def warmup_requests(
    questions: int,
    samples: int,
    max_searches: int,
    first_prompt_chars: int,
    turn_chars: int,
    annotation_chars: int,
    player_max_tokens: int = PLAYER_MAX_TOKENS,
    annotator_max_tokens: int = 512,
) -> tuple[RequestGroup, RequestGroup]:
    """The LLM warmup's requests at most: (player, annotator).

    Player: every episode (``questions`` x ``samples``) plays at most ``max_searches`` + 1 turns
    (the last the forced finish), one request a turn. Turn t's prompt is the first prompt plus t
    turns of history, each at most ``turn_chars`` characters, so a question's S episodes send at
    most S x [(m + 1) x its first prompt + turn_chars x m(m + 1)/2] characters; summed over the
    questions with ``first_prompt_chars`` the sum of their first prompts' characters.
    Annotator: one request an episode; ``annotation_chars``: the sum over the questions of the
    characters of an annotation prompt for the longest play (m + 1 steps of the longest action and
    observation), each sent S times. Completions: calls x max_tokens.
    """
    m = max_searches
    player = RequestGroup(
        "player",
        questions * samples * (m + 1),
        samples * ((m + 1) * first_prompt_chars + questions * turn_chars * m * (m + 1) // 2),
        player_max_tokens,
    )
    annotator = RequestGroup(
        "annotator", questions * samples, samples * annotation_chars, annotator_max_tokens
    )
    return player, annotator


def warmup_estimate(
    player: LLMClient,
    annotator: LLMClient,
    examples: Sequence[QAExample],
    samples: int,
    max_searches: int,
    k: int,
    max_obs_tokens: int,
    cache_tag: str = "",
) -> list[RequestGroup]:
    """``warmup_requests`` measured on the prompts this warmup builds: each question's first
    player prompt (``teacher_policy_messages``, exact), a turn's history at most the player's
    ``max_tokens`` action plus a ``max_obs_tokens`` observation (4 characters a token), and each
    question's annotation prompt (``annotation_messages``) for a play of m + 1 such steps. Cached:
    the episodes whose first player turn is in the player's cache (a cached episode is usually
    replayed whole; the annotator's requests are known only after the play)."""
    firsts = [teacher_policy_messages(ex.question, [], max_searches) for ex in examples]
    action = "x" * (4 * player.max_tokens)
    observation = "x" * (4 * max_obs_tokens)
    turn_chars = len(f"{action}\nObservation: {observation}\n")
    longest = [
        agent_step("search", action, observation, budget_before(t, max_searches, False))
        for t in range(max_searches)
    ] + [agent_step("answer", action, "", 0, forced=True)]
    annotation_chars = sum(
        messages_chars(
            annotation_messages(
                Episode(ex.id, ex.question, list(ex.golden_answers), longest, "x", 0.0), k
            )
        )
        for ex in examples
    )
    p, a = warmup_requests(
        len(examples),
        samples,
        max_searches,
        sum(messages_chars(m) for m in firsts),
        turn_chars,
        annotation_chars,
        player.max_tokens,
        annotator.max_tokens,
    )
    cached = sum(
        player.is_cached(m, f"{cache_tag}|sample={s}") for m in firsts for s in range(samples)
    )
    return [
        RequestGroup(p.name, p.calls, p.prompt_chars, p.max_tokens, cached, player.prices),
        RequestGroup(a.name, a.calls, a.prompt_chars, a.max_tokens, None, annotator.prices),
    ]


# --- the tiny world's oracle ------------------------------------------------------------------

# Per outcome of a step: K_max = 5 (criterion, raw score) pairs, most telling first. Short
# phrases: the tiny tokenizer spends about 6 tokens on an English word outside its world's text,
# so the paper's sentence-long criteria make a 100-token JSON that the 2-layer μ does not learn
# to write whole (arco/README.md); three of these phrases make about 50.
ORACLE_RUBRICS: dict[str, tuple[tuple[str, float], ...]] = {
    "useful_search": (
        ("query names next hop", 0.7),
        ("finds new support", 0.8),
        ("gathers new evidence", 0.6),
        ("follows the plan", 0.5),
        ("short query", 0.4),
    ),
    "redundant_search": (
        ("no repeated search", -0.6),
        ("gathers new evidence", -0.5),
        ("uses found evidence", -0.4),
        ("searches missing hop", -0.4),
        ("query adds entity", -0.3),
    ),
    "missed_search": (
        ("query names next hop", -0.3),
        ("finds new support", -0.4),
        ("query matches title", -0.3),
        ("follows the plan", -0.2),
        ("short query", -0.1),
    ),
    "forced_search": (
        ("answers when forced", -1.0),
        ("follows finish rule", -0.9),
        ("answers before end", -0.9),
        ("respects budget", -0.8),
        ("commits to answer", -0.7),
    ),
    "invalid": (
        ("valid action format", -0.7),
        ("follows the format", -0.6),
        ("uses the turn", -0.5),
        ("saves the budget", -0.5),
        ("one action a turn", -0.3),
    ),
    "grounded_right_answer": (
        ("answer is correct", 0.9),
        ("answer is supported", 0.8),
        ("evidence is complete", 0.7),
        ("resolves every hop", 0.6),
        ("short exact span", 0.5),
    ),
    "guessed_right_answer": (
        ("answer is correct", 0.7),
        ("answer is supported", -0.2),
        ("evidence is complete", -0.1),
        ("resolves every hop", 0.3),
        ("short exact span", 0.5),
    ),
    "premature_wrong_answer": (
        ("answer is correct", -0.9),
        ("evidence is complete", -0.8),
        ("answer is supported", -0.7),
        ("searches missing hop", -0.6),
        ("short exact span", -0.2),
    ),
    "misread_wrong_answer": (
        ("answer is correct", -0.9),
        ("matches the evidence", -0.8),
        ("reads support doc", -0.7),
        ("evidence is complete", 0.3),
        ("short exact span", -0.2),
    ),
}
MAX_ORACLE_K = 5


def oracle_outcomes(episode: Episode, supporting_ids: Sequence[str]) -> list[str]:
    """Each step's ``ORACLE_RUBRICS`` key. A search is useful when it returns a supporting
    document not found before, redundant when it returns only documents seen before or only
    supporting ones found before, missed otherwise; an answer is grounded when every supporting
    document was found before it."""
    support, found, seen = set(supporting_ids), set(), set()
    right = episode.reward > 0.5
    outcomes = []
    for step in episode.steps:
        ids = set(step.doc_ids)
        if step.kind == "search" and step.forced:
            outcome = "forced_search"
        elif step.kind == "search":
            if (ids & support) - found:
                outcome = "useful_search"
            elif ids and (ids <= seen or ids & support):
                outcome = "redundant_search"
            else:
                outcome = "missed_search"
            found |= ids & support
            seen |= ids
        elif step.kind == "answer":
            grounded = support <= found
            outcome = {
                (True, True): "grounded_right_answer",
                (True, False): "guessed_right_answer",
                (False, False): "premature_wrong_answer",
                (False, True): "misread_wrong_answer",
            }[right, grounded]
        else:
            outcome = "invalid"
        outcomes.append(outcome)
    return outcomes


def oracle_support(
    episode: Episode, traj: Trajectory, metadata: Mapping
) -> tuple[Episode, list[str]] | None:
    """What the oracle compares for one played episode: ``(episode, supporting keys)``.

    The tiny world names its supporting documents by id (``metadata["supporting_ids"]``): the
    episode as it is. HotpotQA, 2Wiki and MuSiQue name them by title (``supporting_titles``): the
    episode with each search's documents keyed by their title instead (``traj``'s documents, step
    for step; ``title_key``), so a paragraph counts by what it is, whichever corpus row it came
    from. None when the data names neither."""
    if metadata.get("supporting_ids"):
        return episode, [str(x) for x in metadata["supporting_ids"]]
    titles = metadata.get("supporting_titles")
    if not titles:
        return None
    if len(traj.steps) != len(episode.steps):
        raise ValueError(
            f"question {episode.question_id}: {len(episode.steps)} steps in the episode, "
            f"{len(traj.steps)} in its trajectory"
        )
    steps = [
        replace(step, doc_ids=tuple(title_key(d.title) for d in played.docs))
        for step, played in zip(episode.steps, traj.steps, strict=True)
    ]
    return replace(episode, steps=steps), [title_key(str(t)) for t in titles]


def oracle_annotation(
    episode: Episode, k: int, supporting_ids: Sequence[str]
) -> list[StepAnnotation]:
    """The tiny world's hindsight annotation: per step the first k (criterion, score) pairs of its
    outcome's rubric (``oracle_outcomes``), the scores projected so that
    sum_t mean_k score_{t,k} = R exactly (``project_scores``). Deterministic."""
    if not 1 <= k <= MAX_ORACLE_K:
        raise ValueError(f"k must be in 1..{MAX_ORACLE_K}, got {k}")
    rubrics = [ORACLE_RUBRICS[o][:k] for o in oracle_outcomes(episode, supporting_ids)]
    scores = project_scores([[s for _, s in r] for r in rubrics], episode.reward)  # [n, k]
    return [
        StepAnnotation([c for c, _ in r], [float(x) for x in row])
        for r, row in zip(rubrics, scores, strict=True)
    ]
