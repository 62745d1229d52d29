"""The teacher's prompts: Stage A (gold-blind) and Stage B (gold-aware), and how evidence is shown.

A prompt is a ``TeacherPrompt``: a point on E2E-APE's axes (instruction wording with its S/I/A
definitions, answer-span rule, few-shot examples on or off, and the evidence layout: sub-queries
shown, titles shown, document order, top-m documents per round). Its ``id`` spells out those
options, so ``get_prompt(id)`` rebuilds any prompt from its id alone, and its ``hash`` (first 12
hex digits of the sha256 of the template text and layout) versions its content: a frozen policy
records both and refuses a prompt whose text changed since.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol

if TYPE_CHECKING:  # the rollout package imports torch; evidence rendering needs none of it
    from common.rollout.trajectory import Trajectory

STATUS_NAMES = {"S": "supported_answer", "I": "insufficient_evidence", "A": "ambiguous_evidence"}
DOC_ORDERS = ("rank", "reverse")


class DocLike(Protocol):
    title: str
    text: str


class Round(NamedTuple):
    """One search round of the actor: its sub-query and the documents it was shown, best first."""

    query: str
    docs: Sequence[DocLike]


def rounds_from_trajectory(trajectory: Trajectory) -> list[Round]:
    """The search rounds of a rollout, in order (a search that returned nothing stays a round),
    each with the documents the actor saw after the observation limit (``Step.shown_docs``)."""
    return [
        Round(step.query, step.shown_docs)
        for step in trajectory.steps
        if step.kind == "search" and step.query is not None
    ]


def render_evidence(
    rounds: Sequence[Round],
    show_queries: bool,
    top_m: int,
    show_titles: bool = True,
    doc_order: str = "rank",
) -> str:
    """The evidence block: per round, its sub-query (if shown) and its top-m documents.

    Documents are numbered across rounds; ``doc_order="reverse"`` lists each round's top-m
    documents worst first, so that the best sits nearest the end of the prompt.
    """
    if top_m < 1:
        raise ValueError(f"top_m must be at least 1, got {top_m}")
    if doc_order not in DOC_ORDERS:
        raise ValueError(f"doc_order must be one of {DOC_ORDERS}, got {doc_order!r}")
    if not rounds:
        return "(no search was made, so there are no documents)"
    blocks, n = [], 0
    for r, (query, docs) in enumerate(rounds, start=1):
        lines = [f"Search round {r}"]
        if show_queries:
            lines.append(f"Query: {query}")
        shown = list(docs[:top_m])
        if doc_order == "reverse":
            shown.reverse()
        if not shown:
            lines.append("(no documents returned)")
        for doc in shown:
            n += 1
            title = f"(Title: {doc.title}) " if show_titles and doc.title else ""
            lines.append(f"Doc {n} {title}{doc.text}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def evidence_text(rounds: Sequence[Round], top_m: int) -> str:
    """The plain text of the top-m documents of every round (titles and texts), for literal
    matching of reference answers in the evidence."""
    return "\n".join(f"{d.title}\n{d.text}" for _, docs in rounds for d in docs[:top_m])


# --- the template pieces (written for this project) ------------------------------------------

_DEFINITIONS = """Statuses:
- supported_answer: the documents, read together, establish one complete answer to the question.
- insufficient_evidence: at least one fact or link that the answer needs is absent from the documents.
- ambiguous_evidence: the documents support two or more complete answers that cannot all be true."""

INSTRUCTIONS = {
    "A": {
        "basic": (
            "You are auditing the documents a search agent retrieved for a question. Decide, "
            "from these documents alone, whether they are enough to answer it. Do not use your "
            "own knowledge of the world: a fact counts only if a document states it."
        ),
        "checklist": (
            "You are auditing the documents a search agent retrieved for a question. Decide, "
            "from these documents alone, whether they are enough to answer it. Before deciding, "
            "check four things: the entity the documents describe is the one the question asks "
            "about; the relation asked for is stated, not guessed; the scope (time, place, "
            "qualifier) matches; and in a multi-step question every intermediate entity is "
            "linked to the next by some document. Your own knowledge does not count."
        ),
        "strict": (
            "You are auditing the documents a search agent retrieved for a question. Decide, "
            "from these documents alone, whether they are enough to answer it. If reaching an "
            "answer needs any guess, assumption or outside knowledge, the evidence is "
            "insufficient; when in doubt between supported and insufficient, choose insufficient."
        ),
    },
    "B": {
        "verify": (
            "You are verifying an answer against the documents a search agent retrieved. You "
            "are given a candidate answer: it is a claim to check, not evidence. Using the "
            "documents alone, check that they name the same entity, state the relation the "
            "question asks about, match its scope, and link every intermediate step. If they "
            "support the candidate, answer with it; if they support a different complete "
            "answer instead, give that answer."
        ),
        "skeptic": (
            "You are verifying an answer against the documents a search agent retrieved. A "
            "candidate answer is given only as a claim to test; assume nothing from it. Rebuild "
            "the answer from the documents step by step: find the entity, the stated relation, "
            "the scope and each bridge between steps. Report what the documents support, "
            "whether or not it agrees with the candidate; if they do not support any complete "
            "answer, say so."
        ),
    },
}

WRITTEN_PREFIX = "ctl_"
_HEX_TO_LETTERS = str.maketrans("0123456789abcdef", "abcdefghijklmnop")


def register_instruction(stage: str, text: str) -> str:
    """Add an instruction written by the E2E-APE controller to ``INSTRUCTIONS[stage]``; returns
    its name, ``ctl_`` + the first 10 hex digits of the text's SHA-256 spelled in letters (so a
    prompt id stays ``[a-z_]``), the same for the same text. A frozen policy file carries the
    texts it uses and registers them again when read."""
    if stage not in INSTRUCTIONS:
        raise ValueError(f"stage must be 'A' or 'B', got {stage!r}")
    text = text.strip()
    if not text:
        raise ValueError("an instruction text cannot be empty")
    digest = hashlib.sha256(f"{stage}\n{text}".encode()).hexdigest()[:10]
    name = WRITTEN_PREFIX + digest.translate(_HEX_TO_LETTERS)
    INSTRUCTIONS[stage][name] = text
    return name


ANSWER_RULES = {
    "span": "The answer is the shortest span copied from the documents that answers the question "
    "(a name, title, date, number, or yes/no).",
    "short": "The answer is a few words, not a sentence, with no explanation.",
}

_FEW_SHOT = """Example 1
Question: Where was the director of the film Lanterns born?
Documents: "Lanterns is a 1998 film directed by Ora Velk." "Ora Velk was born in Tamsford."
Reply: <reason>Lanterns was directed by Ora Velk, who was born in Tamsford.</reason><status>supported_answer</status><answer>Tamsford</answer>

Example 2
Question: Where was the director of the film Lanterns born?
Documents: "Lanterns is a 1998 film directed by Ora Velk."
Reply: <reason>The director is named, but no document gives where Ora Velk was born.</reason><status>insufficient_evidence</status><answer></answer>"""

_FORMAT = """Reply with exactly these three elements, in this order, and nothing before or after them:
<reason>one or two sentences</reason><status>STATUS</status><answer>ANSWER</answer>
STATUS is supported_answer, insufficient_evidence or ambiguous_evidence. ANSWER is the answer when STATUS is supported_answer, and empty (<answer></answer>) otherwise."""

_ID = re.compile(
    r"(?P<stage>[AB])-(?P<instruction>[a-z_]+)-(?P<answer_rule>[a-z_]+)-fs(?P<few_shot>[01])"
    r"-q(?P<show_queries>[01])-t(?P<show_titles>[01])-(?P<doc_order>[a-z]+)-m(?P<top_m>\d+)"
)


@dataclass(frozen=True)
class TeacherPrompt:
    """One teacher prompt: stage "A" (gold-blind) or "B" (gold-aware) and its options.

    Stage B never shows sub-queries: it sees the documents only.
    """

    stage: Literal["A", "B"]
    instruction: str
    answer_rule: str = "span"
    few_shot: bool = False
    show_queries: bool = True
    show_titles: bool = True
    doc_order: str = "rank"
    top_m: int = 5

    def __post_init__(self) -> None:
        if self.stage not in INSTRUCTIONS:
            raise ValueError(f"stage must be 'A' or 'B', got {self.stage!r}")
        if self.instruction not in INSTRUCTIONS[self.stage]:
            known = sorted(INSTRUCTIONS[self.stage])
            raise ValueError(
                f"unknown stage-{self.stage} instruction {self.instruction!r}: {known}"
            )
        if self.answer_rule not in ANSWER_RULES:
            raise ValueError(f"unknown answer rule {self.answer_rule!r}: {sorted(ANSWER_RULES)}")
        if self.doc_order not in DOC_ORDERS:
            raise ValueError(f"doc_order must be one of {DOC_ORDERS}, got {self.doc_order!r}")
        if self.top_m < 1:
            raise ValueError(f"top_m must be at least 1, got {self.top_m}")
        if self.stage == "B" and self.show_queries:
            raise ValueError("a stage-B prompt shows the documents without the sub-queries")

    @property
    def id(self) -> str:
        return (
            f"{self.stage}-{self.instruction}-{self.answer_rule}-fs{int(self.few_shot)}"
            f"-q{int(self.show_queries)}-t{int(self.show_titles)}-{self.doc_order}-m{self.top_m}"
        )

    @property
    def text(self) -> str:
        """The template, with fields {question}, {evidence} and (stage B) {references}."""
        parts = [
            INSTRUCTIONS[self.stage][self.instruction],
            _DEFINITIONS,
            ANSWER_RULES[self.answer_rule],
        ]
        if self.few_shot:
            parts.append(_FEW_SHOT)
        parts.append(_FORMAT)
        task = "Question: {question}"
        if self.stage == "B":
            task += "\nCandidate answer to check (a claim, not evidence; | separates variants): {references}"
        parts.append(task + "\n\nDocuments:\n{evidence}")
        return "\n\n".join(parts)

    @property
    def hash(self) -> str:
        layout = f"queries={self.show_queries} titles={self.show_titles} order={self.doc_order} m={self.top_m}"
        return hashlib.sha256(f"{layout}\n{self.text}".encode()).hexdigest()[:12]

    def messages(
        self,
        question: str,
        rounds: Sequence[Round],
        references: Sequence[str] | None = None,
    ) -> list[dict[str, str]]:
        """The chat messages for one item; stage B needs the references, stage A must not see them."""
        if (self.stage == "B") != bool(references):
            need = "needs the reference answers" if self.stage == "B" else "is gold-blind"
            raise ValueError(f"prompt {self.id}: stage {self.stage} {need}")
        evidence = render_evidence(
            rounds, self.show_queries, self.top_m, self.show_titles, self.doc_order
        )
        fields = {"question": question.strip(), "evidence": evidence}
        if references:
            fields["references"] = " | ".join(f'"{r}"' for r in references)
        return [{"role": "user", "content": self.text.format(**fields)}]


STAGE_A_DEFAULT = TeacherPrompt("A", "checklist")
STAGE_B_DEFAULT = TeacherPrompt("B", "verify", show_queries=False)
PROMPTS: dict[str, TeacherPrompt] = {p.id: p for p in (STAGE_A_DEFAULT, STAGE_B_DEFAULT)}


def get_prompt(prompt_id: str) -> TeacherPrompt:
    """The prompt named ``prompt_id``: a registered one, or any point of the axes by its id."""
    if prompt_id in PROMPTS:
        return PROMPTS[prompt_id]
    match = _ID.fullmatch(prompt_id)
    if match is None:
        raise ValueError(
            f"unknown prompt id {prompt_id!r}: expected e.g. {STAGE_A_DEFAULT.id!r} "
            "(stage-instruction-answerrule-fs01-q01-t01-order-mN)"
        )
    g = match.groupdict()
    prompt = TeacherPrompt(
        stage=g["stage"],
        instruction=g["instruction"],
        answer_rule=g["answer_rule"],
        few_shot=g["few_shot"] == "1",
        show_queries=g["show_queries"] == "1",
        show_titles=g["show_titles"] == "1",
        doc_order=g["doc_order"],
        top_m=int(g["top_m"]),
    )
    if prompt.id != prompt_id:  # e.g. a zero-padded top_m
        raise ValueError(f"prompt id {prompt_id!r} is not canonical; use {prompt.id!r}")
    return prompt
