"""Agent protocols: how a turn's text becomes an action, and what the environment inserts.

``search_r1``: ``<think>…</think>``, ``<search> q </search>``, ``<information>…</information>``
(inserted), ``<answer> a </answer>``. ``react``: ``Search[q]`` / ``Finish[a]``, one action a turn.
``unfinished(text)``: whether a turn that stopped on a stop string must be resumed (ReAct: the
``]`` closed a bracket inside the action's argument, not the action).

What the environment inserts comes as (head, body, tail): the body is the environment's answer
(the documents, the invalid-action explanation), the head and tail are the protocol's frame. An
agent that states its budget (``budget_message``, the ARCO release's ``turn.txt``) puts the
statement between body and tail, so the body stays the environment's text alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from common.retrieval.base import Doc, format_docs

ActionKind = Literal["search", "answer", "invalid"]


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    query: str | None = None
    answer: str | None = None


SEARCH_R1_INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first "
    "every time you get new information. After reasoning, if you find you lack some knowledge, "
    "you can call a search engine by <search> query </search> and it will return the top "
    "searched results between <information> and </information>. You can search as many times "
    "as you want. If you find no further external knowledge needed, you can directly provide "
    "the answer inside <answer> and </answer>, without detailed illustrations. "
    "Question: {question}\n"
)

BUDGET_STATEMENT = (
    "You have {n} search(es) remaining. Use them wisely before submitting your answer."
)

REACT_INSTRUCTION = (
    "Answer the question by interleaving Thought and Action steps. An action is either "
    "Search[query], which returns documents as an Observation, or Finish[answer], which ends "
    "the episode with your answer. Take one action per turn.\nQuestion: {question}\n"
)


class SearchR1Protocol:
    name = "search_r1"
    stop = ["</search>", "</answer>"]
    answer_stop = ["</answer>"]

    _answer = re.compile(r"<answer>(.*?)</answer>", re.S)
    _search = re.compile(r"<search>(.*?)</search>", re.S)

    def user_prompt(self, question: str) -> str:
        return SEARCH_R1_INSTRUCTION.format(question=question.strip())

    def format_search(self, query: str) -> str:
        return f"<search> {query} </search>"

    def format_answer(self, answer: str) -> str:
        return f"<answer> {answer} </answer>"

    def parse(self, text: str) -> Action:
        """The turn's action: an answer wins over a search; neither (or an empty one) is invalid."""
        answers = self._answer.findall(text)
        if answers and answers[-1].strip():
            return Action("answer", answer=answers[-1].strip())
        searches = self._search.findall(text)
        if searches and searches[-1].strip():
            return Action("search", query=searches[-1].strip())
        return Action("invalid")

    def unfinished(self, text: str) -> bool:
        return False

    def observation(self, docs: list[Doc], titles: bool = True) -> tuple[str, str, str]:
        """(head, body, tail): the body is what gets truncated to the observation budget."""
        if titles:
            body = format_docs(docs)
        else:
            body = "".join(f"Doc {i} {d.text}\n" for i, d in enumerate(docs, 1))
        return "\n\n<information>", body, "</information>\n\n"

    def invalid_observation(self) -> tuple[str, str, str]:
        """(head, body, tail) of the message after an invalid turn: the body is the explanation."""
        return (
            "\n",
            "My previous action is invalid. If I want to search, I should put the query "
            "between <search> and </search>. If I want to give the final answer, I should put "
            "the answer between <answer> and </answer>. Let me try again.",
            "\n",
        )

    def invalid_message(self) -> str:
        return "".join(self.invalid_observation())

    def budget_message(self, n: int) -> str:
        """The budget statement, inserted between an observation's body and its tail."""
        return "\n" + BUDGET_STATEMENT.format(n=n)

    def force_answer_message(self) -> str:
        return "\nI have used all my searches. I must give the final answer now.\n"


class ReActProtocol:
    """``Search[q]`` / ``Finish[a]``; the argument keeps its own brackets and parentheses.

    An action's argument runs to the ``]`` that balances its ``[``, so ``Search[Foo (film)]`` and
    ``Search[a [b] c]`` search ``Foo (film)`` and ``a [b] c``. Generation stops at every ``]``
    (vLLM stop strings are plain substrings, so "the balancing ``]``" cannot be a stop string);
    a turn that stopped on a ``]`` inside an open action is ``unfinished`` and the agent loop
    resumes it. Stopping at ``]`` keeps a turn from running on past its action.
    """

    name = "react"
    stop = ["]"]
    answer_stop = ["]"]

    _opener = re.compile(r"(Search|Finish)\[")

    def user_prompt(self, question: str) -> str:
        return REACT_INSTRUCTION.format(question=question.strip())

    def format_search(self, query: str) -> str:
        return f"Search[{query}]"

    def format_answer(self, answer: str) -> str:
        return f"Finish[{answer}]"

    def _first_action(self, text: str) -> tuple[str, str | None] | None:
        """(verb, argument) of the turn's first action; argument None while its bracket is open."""
        m = self._opener.search(text)
        if m is None:
            return None
        depth = 1
        for j in range(m.end(), len(text)):
            depth += (text[j] == "[") - (text[j] == "]")
            if depth == 0:
                return m.group(1), text[m.end() : j]
        return m.group(1), None

    def parse(self, text: str) -> Action:
        """The first action in the turn (ReAct allows one per turn); unclosed or empty: invalid."""
        found = self._first_action(text)
        if found is None or found[1] is None or not found[1].strip():
            return Action("invalid")
        verb, arg = found[0], found[1].strip()
        return Action("search", query=arg) if verb == "Search" else Action("answer", answer=arg)

    def unfinished(self, text: str) -> bool:
        """Stopped on a ``]`` that closed a bracket inside the action's argument."""
        found = self._first_action(text)
        return text.endswith("]") and found is not None and found[1] is None

    def observation(self, docs: list[Doc], titles: bool = True) -> tuple[str, str, str]:
        """Without titles, the documents' texts alone, one a line (ARCO's distractor setting)."""
        if titles:
            body = " ".join(f"[{i}] {d.title}: {d.text}" for i, d in enumerate(docs, 1))
        else:
            body = "\n".join(d.text for d in docs)
        return "\nObservation: ", body, "\nThought:"

    def invalid_observation(self) -> tuple[str, str, str]:
        """(head, body, tail) of the message after an invalid turn: the body is the explanation."""
        return (
            "\nObservation: ",
            "Invalid action. Use Search[query] or Finish[answer].",
            "\nThought:",
        )

    def invalid_message(self) -> str:
        return "".join(self.invalid_observation())

    def budget_message(self, n: int) -> str:
        """The budget statement, inserted between an observation's body and its tail."""
        return "\n" + BUDGET_STATEMENT.format(n=n)

    def force_answer_message(self) -> str:
        return "\nObservation: The search budget is used up. Finish now.\nThought:"


PROTOCOLS = {"search_r1": SearchR1Protocol, "react": ReActProtocol}


def get_protocol(name: str) -> SearchR1Protocol | ReActProtocol:
    if name not in PROTOCOLS:
        raise ValueError(f"unknown agent protocol {name!r}; choose one of {sorted(PROTOCOLS)}")
    return PROTOCOLS[name]()
