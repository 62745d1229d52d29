"""The rubric model's text side: the prompt μ writes criteria from, and the parser of its answer.

μ sees the question, the trajectory before the judged action (the prefix h_t), the search budget
left and the action a_t, and writes exactly K short criteria as ``{"criteria": [...]}``.
``prefix="after"`` reproduces the public release's RL rollouts, which build the prompt after the
environment step: the history then already holds a_t and its observation, and the budget is the
release's count (``_build_mu_text``): the search budget minus the searches in that history, the
judged one included; an answer or an invalid action costs nothing there. ``prefix="none"`` is the w/o-Prefix ablation: the question and the action only.

Where the criteria come from is the rubric's ``mode``: ``adaptive`` (μ writes them), ``fixed``
(the same dataset-level criteria for every step, read by ``read_criteria_file``; w/o-Adaptive) or
``none`` (no criteria: the prompt without its request is scored alone; w/o-Rubric and the PRM).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from arco.steps import AgentStep

DEFAULT_TASK = (
    "A search agent answers multi-hop questions. It acts one step at a time: either a search "
    "with a query, which returns a document, or a final answer, which ends the episode. It may "
    "make at most 3 searches, and an invalid action (neither a search nor an answer) also uses "
    "one up; once none remain, the agent must finish with an answer."
)
PREFIX_MODES = ("before", "after", "none")
REQUEST_PLACES = ("user", "system")
RUBRIC_MODES = ("adaptive", "fixed", "none")

SYSTEM_TEMPLATE = (
    "You write rubrics for judging one step of an agent's trajectory. A rubric is a short list of "
    "criteria, each a short phrase naming what a good action at this point should achieve; each "
    "criterion is later scored against the action.\n\nThe agent's task: {task}"
)
REQUEST_TEMPLATE = (
    "Write exactly {k} short criterion phrases for judging the action being evaluated, specific "
    "to this question and this point of the trajectory. Consider query targeting, planning, "
    "evidence gathering, answer readiness and avoiding redundant searches.\n"
    "Rules:\n"
    "- If the action is invalid (neither a search nor a final answer), the criteria must address "
    "taking a valid action in the required format.\n"
    "- If the action is a search while no searches remain, the criteria must address that the "
    "agent had to finish with an answer instead.\n"
    "Reply with JSON only, exactly {k} strings: {example}"
)

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)


def _history(steps: Sequence[AgentStep]) -> str:
    lines = []
    for step in steps:
        lines.append(f"Action: {step.action}")
        if step.observation:
            lines.append(f"Observation: {step.observation}")
    return "\n".join(lines) or "(none)"


def _search_budget(steps: Sequence[AgentStep]) -> int:
    """The episode's search budget (``env.max_searches``), from the steps' own record: a free
    turn i was taken with ``max_searches - i`` left (``arco.steps.budget_before``). 0 for an
    episode whose only turn was the forced one."""
    for i, step in enumerate(steps):
        if not step.forced:
            return step.searches_left + i
    return 0


def release_budget_after(steps: Sequence[AgentStep], t: int) -> int:
    """The budget the release's μ sees for step ``t`` (``rubric.prefix=after``): its
    ``max_steps`` minus the Search actions in the history after the environment step, step ``t``
    included (``_step_cost``: 1 for a Search, 0 for a Finish or an invalid action), at least 0."""
    done = sum(step.kind == "search" for step in steps[: t + 1])
    return max(_search_budget(steps) - done, 0)


def rubric_messages(
    question: str,
    steps: Sequence[AgentStep],
    t: int,
    k: int,
    prefix: str = "before",
    task: str = DEFAULT_TASK,
    system: str = SYSTEM_TEMPLATE,
    request: str = REQUEST_TEMPLATE,
    request_in: str = "user",
) -> list[dict[str, str]]:
    """The [system, user] chat messages asking μ for the K criteria of step ``t``.

    ``system`` (with ``{task}``) and ``request`` (with ``{k}`` and ``{example}``) default to the
    paper's wording; a tiny model gets shorter ones from its config. An empty ``request`` leaves
    the request out (rubric mode ``none``: the prompt is scored without criteria).

    ``prefix``: "before" shows steps < t and the budget before a_t; "after" (the release's RL
    bug) also shows step t's own action and observation and the release's budget after the step
    (``release_budget_after``); "none" shows neither trajectory nor budget.

    ``request_in``: "user" closes the user text with the request (the spec's layout); "system"
    ends the system text with it instead, so every rubric prompt starts with the same system
    text, request included, and a step's own part is the question, trajectory, budget and action
    (vLLM's prefix cache and the shared-prefix trunk then share the request too).
    """
    if prefix not in PREFIX_MODES:
        raise ValueError(f"prefix must be one of {PREFIX_MODES}, got {prefix!r}")
    if not 0 <= t < len(steps):
        raise ValueError(f"t must index one of the {len(steps)} steps, got {t}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if request_in not in REQUEST_PLACES:
        raise ValueError(f"request_in must be one of {REQUEST_PLACES}, got {request_in!r}")
    step = steps[t]
    parts = [f"Question: {question.strip()}"]
    if prefix != "none":
        shown = steps[: t + 1] if prefix == "after" else steps[:t]
        budget = release_budget_after(steps, t) if prefix == "after" else step.searches_left
        parts.append(f"Trajectory so far:\n{_history(shown)}")
        parts.append(f"Searches remaining before this action: {budget}")
    parts.append(f"Action being evaluated: {step.action}")
    system_text = system.format(task=task)
    if request:
        asked = request.format(k=k, example=format_criteria(["..."] * k))
        if request_in == "system":
            system_text += "\n\n" + asked
        else:
            parts.append(asked)
    return [
        {"role": "system", "content": system_text},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def format_criteria(criteria: Sequence[str]) -> str:
    """The JSON text μ is trained to write: ``{"criteria": [...]}``."""
    return json.dumps({"criteria": list(criteria)}, ensure_ascii=False)


def read_criteria_file(path: str, k: int) -> list[str]:
    """The fixed criteria of the w/o-Adaptive ablation: one a line, blank lines and ``#`` lines
    skipped; exactly ``k`` of them, else a one-line error naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.strip() for line in f]
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{path}: not UTF-8 text (byte {err.start}); the criteria file is one criterion a line"
        ) from None
    bad = next((i for i, line in enumerate(lines, 1) if not line.isprintable()), None)
    if bad is not None:
        raise ValueError(
            f"{path}:{bad}: not readable text (control characters); one criterion a line"
        )
    criteria = [line for line in lines if line and not line.startswith("#")]
    if len(criteria) != k:
        raise ValueError(
            f"{path}: {len(criteria)} criteria, rubric.k={k} needs exactly {k} (one a line)"
        )
    return criteria


def strip_thinking(text: str) -> str:
    text = _THINK_BLOCK.sub("", text)
    # A close without an open: the block was opened in the prompt. An open without a close: the
    # model never stopped thinking, so nothing after it is an answer.
    text = text.rpartition("</think>")[2]
    return text.partition("<think>")[0]


def parse_criteria(text: str, k: int) -> list[str] | None:
    """The K criteria of μ's answer, or None when the rubric is invalid. Never raises.

    Think blocks are dropped; the first JSON object with a "criteria" list counts, whatever text
    (code fences, prose) surrounds it; it must hold exactly ``k`` strings, each non-empty once
    stripped.
    """
    if not isinstance(text, str) or k < 1:
        return None
    text = strip_thinking(text)
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, match.start())
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict) and isinstance(obj.get("criteria"), list):
            items = obj["criteria"]
            if len(items) != k or not all(isinstance(c, str) and c.strip() for c in items):
                return None
            return [c.strip() for c in items]
    return None


def rubric_prompt_ids(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """The chat-templated rubric prompt with the assistant header, thinking off, as token ids."""
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, enable_thinking=False
    )
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)
