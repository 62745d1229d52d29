"""The two-stage evidence teacher: verdict parsing, the merge rules, and the gated teacher.

Stage A (gold-blind) judges whether the actor's retrieved evidence supports one complete answer
(S), misses a needed fact (I), or supports several incompatible answers (A). Stage B (gold-aware)
runs only where A said S or A, and checks the reference answer against the same documents.
``merge_verdicts`` combines them without ever crossing the insufficiency boundary.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal, Protocol

from common.metrics import cover_exact_match, f1_score
from eviback.prompts import STATUS_NAMES, Round, evidence_text, get_prompt

Status = Literal["S", "I", "A"]
Messages = list[dict[str, str]]
Backend = Callable[[list[Messages]], list[tuple[str | None, Mapping[str, Any]]]]

_STATUS_CODES = {name: code for code, name in STATUS_NAMES.items()}
_TAGS = ("reason", "status", "answer")
_CONTRACT = re.compile(
    r"\s*<reason>(.*)</reason>\s*<status>(.*)</status>\s*<answer>(.*)</answer>\s*", re.S
)


@dataclass(frozen=True)
class Verdict:
    """A teacher's judgement of one item; ``error`` says why an invalid verdict is invalid.
    ``failed``: no usable answer came back (the request failed after its retries, the reply came
    from another model, or it broke the verdict contract however often it was asked), so there
    is no verdict at all: the reward treats the item as missing (``eviback.backoff``), not as a
    judgement of insufficient evidence, nor as a zero."""

    valid: bool
    status: Status | None
    answer: str = ""
    reason: str = ""
    error: str = ""
    failed: bool = False


def _invalid(error: str, failed: bool = False) -> Verdict:
    return Verdict(False, None, "", "", error, failed)


def parse_verdict(text: str | None) -> Verdict:
    """Read ``<reason>…</reason><status>…</status><answer>…</answer>`` strictly.

    Whitespace is allowed around and between the elements and inside the status. Each tag must
    occur exactly once; the status must be supported_answer, insufficient_evidence or
    ambiguous_evidence; S needs a non-empty answer, I and A an empty one. Anything else gives an
    invalid verdict; this never raises.
    """
    if not isinstance(text, str):
        return _invalid(f"parse: expected text, got {type(text).__name__}")
    for tag in _TAGS:
        for t in (f"<{tag}>", f"</{tag}>"):
            if text.count(t) != 1:
                return _invalid(f"parse: {t} occurs {text.count(t)} times, expected once")
    match = _CONTRACT.fullmatch(text)  # each tag occurs once, so the groups are unambiguous
    if match is None:
        return _invalid("parse: text outside the elements, or elements out of order")
    reason, status_name, answer = (g.strip() for g in match.groups())
    status = _STATUS_CODES.get(status_name)
    if status is None:
        return _invalid(f"parse: unknown status {status_name[:40]!r}")
    if status == "S" and not answer:
        return _invalid("parse: supported_answer with an empty answer")
    if status != "S" and answer:
        return _invalid(f"parse: {status_name} with a non-empty answer")
    return Verdict(True, status, answer, reason)


def format_verdict(verdict: Verdict) -> str:
    """The contract text of a valid verdict (``parse_verdict`` reads it back)."""
    if not verdict.valid or verdict.status is None:
        raise ValueError(f"an invalid verdict has no contract text ({verdict.error})")
    return (
        f"<reason>{verdict.reason}</reason><status>{STATUS_NAMES[verdict.status]}</status>"
        f"<answer>{verdict.answer}</answer>"
    )


def merge_verdicts(
    stage_a: Verdict,
    stage_b: Verdict | None,
    references: Sequence[str],
    evidence_text: str,
    canonicalize: bool = True,
) -> Verdict:
    """The spec's merge; the insufficiency boundary is never crossed.

    1. A invalid -> A.  2. A says I -> A.  3. B missing, invalid or I -> A.
    4. A says S and B not S -> A.  5. Otherwise B; when both say S, the one whose answer has the
    higher token F1 against the references (B on a tie).
    6. (``canonicalize``) When the result is S and a reference occurs literally (normalised, on
    token boundaries) in the evidence with a higher F1 than the chosen answer, that reference
    replaces the answer. A reference's F1 is taken against all references, so any non-empty
    reference found in the evidence outranks an answer with F1 < 1.
    """
    merged = _merge_stages(stage_a, stage_b, references)
    if canonicalize and merged.status == "S":  # rule 6
        best, best_f1 = merged.answer, f1_score(merged.answer, references)
        for ref in references:
            f1 = f1_score(ref, references)
            if f1 > best_f1 and cover_exact_match(evidence_text, [ref]):
                best, best_f1 = ref, f1
        if best != merged.answer:
            merged = Verdict(True, "S", best, merged.reason)
    return merged


def _merge_stages(a: Verdict, b: Verdict | None, references: Sequence[str]) -> Verdict:
    """Merge rules 1-5."""
    if not a.valid or a.status == "I":  # rules 1, 2
        return a
    if b is None or not b.valid or b.status == "I":  # rule 3
        return a
    if a.status == "S" and b.status != "S":  # rule 4
        return a
    if a.status == "S" and f1_score(a.answer, references) > f1_score(b.answer, references):
        return a  # rule 5: both S, A's answer is the better one
    return b  # rule 5


# --- the teacher ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TeacherItem:
    """What the teacher judges: a question, the actor's search rounds, the gold answers, and the
    example's metadata (the oracle reads the supporting documents there)."""

    question: str
    rounds: Sequence[Round]
    references: Sequence[str]
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Judgement:
    final: Verdict
    stage_a: Verdict
    stage_b: Verdict | None = None


@dataclass
class TeacherStats:
    """Counts for one batch (or, added up, a run). Verdict mix is over the final verdicts."""

    items: int = 0
    calls_a: int = 0
    calls_b: int = 0
    failures: int = 0  # backend errors (no answer), each also an invalid, failed verdict
    broken: int = 0  # replies that broke the verdict contract every time asked (failed verdicts)
    wrong_model: int = 0  # replies refused for coming from another model (failed verdicts)
    invalid_a: int = 0  # stage A requests without a usable verdict (failed, broken, other model)
    invalid_b: int = 0
    cached: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    supported: int = 0
    insufficient: int = 0
    ambiguous: int = 0
    invalid: int = 0

    def add(self, other: TeacherStats) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def count_final(self, verdicts: Sequence[Verdict]) -> None:
        for v in verdicts:
            key = {"S": "supported", "I": "insufficient", "A": "ambiguous"}.get(v.status or "")
            setattr(self, key or "invalid", getattr(self, key or "invalid") + 1)

    @property
    def calls(self) -> int:
        return self.calls_a + self.calls_b

    @property
    def failure_share(self) -> float:
        """The share of requests that gave no usable verdict: failed, or did not parse."""
        return (self.invalid_a + self.invalid_b) / self.calls if self.calls else 0.0

    @property
    def failure_share_a(self) -> float:
        """Stage A's (gold-blind) share of requests without a usable verdict."""
        return self.invalid_a / self.calls_a if self.calls_a else 0.0

    @property
    def failure_share_b(self) -> float:
        """Stage B's (gold-aware) share: it makes at most as many requests as stage A, so a dead
        stage B keeps ``failure_share`` at 0.5 or under; its own share is 1."""
        return self.invalid_b / self.calls_b if self.calls_b else 0.0

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "calls": self.calls}


STAGES = {"A": "stage A (gold-blind)", "B": "stage B (gold-aware)"}


class Teacher(Protocol):
    def judge(self, items: Sequence[TeacherItem]) -> tuple[list[Judgement], TeacherStats]: ...


@dataclass(frozen=True)
class TeacherPolicy:
    """Which prompts the teacher runs: Stage A alone (``stage_b=None``) or gated two-stage.

    ``gate``: the Stage-A statuses that send an item to Stage B. ``canonicalize``: merge rule 6.
    """

    stage_a: str
    stage_b: str | None = None
    gate: tuple[str, ...] = ("S", "A")
    canonicalize: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "gate", tuple(self.gate))
        if get_prompt(self.stage_a).stage != "A":
            raise ValueError(f"stage_a {self.stage_a!r} is not a stage-A prompt")
        if self.stage_b is not None and get_prompt(self.stage_b).stage != "B":
            raise ValueError(f"stage_b {self.stage_b!r} is not a stage-B prompt")
        if not self.gate or not set(self.gate) <= {"S", "A"}:
            raise ValueError(f"gate must be a non-empty subset of ('S', 'A'), got {self.gate}")

    @property
    def strategy_id(self) -> str:
        if self.stage_b is None:
            return f"single:{self.stage_a}"
        gate = "".join(sorted(self.gate, reverse=True))
        return f"gated:{self.stage_a}+{self.stage_b}:gate={gate}:canon={int(self.canonicalize)}"


def parses(text: str) -> bool:
    """Whether a teacher reply keeps the verdict contract (an ``LLMClient``'s ``accept``: a reply
    that does not parse is counted, asked again up to the client's ``reasks`` times
    (``teacher.contract_retries``), warned about and never cached, so a resume asks again)."""
    return parse_verdict(text).valid


def as_backend(client_or_backend: Any) -> Backend:
    """A backend from an ``LLMClient`` (anything with ``chat_many``) or a backend callable."""
    chat_many = getattr(client_or_backend, "chat_many", None)
    if chat_many is None:
        if not callable(client_or_backend):
            raise TypeError("a teacher backend must have chat_many() or be callable")
        return client_or_backend
    return lambda batch: [(r.text, asdict(r)) for r in chat_many(batch, accept=parses)]


class TwoStageTeacher:
    """Runs Stage A on every item, Stage B on the gated ones, and merges (``merge_verdicts``).

    A backend failure (text None: the request failed, or the reply came from another model) and
    a reply that breaks the verdict contract (refused by the client's check after its re-asks,
    or, from a plain backend, not parsing) are counted, invalid verdicts marked ``failed``
    (missing, not a judgement, never a zero); nothing raises for them.
    """

    def __init__(self, client_or_backend: Any, policy: TeacherPolicy):
        self.backend = as_backend(client_or_backend)
        self.policy = policy
        self.prompt_a = get_prompt(policy.stage_a)
        self.prompt_b = None if policy.stage_b is None else get_prompt(policy.stage_b)
        self.totals = TeacherStats()
        self._totals_lock = threading.Lock()

    def judge(self, items: Sequence[TeacherItem]) -> tuple[list[Judgement], TeacherStats]:
        for i, item in enumerate(items):
            if not item.references:
                raise ValueError(f"teacher item {i} ({item.question[:60]!r}) has no references")
        stats = TeacherStats(items=len(items))
        stage_a = self._run([self.prompt_a.messages(it.question, it.rounds) for it in items], stats)
        stats.calls_a, stats.invalid_a = len(items), sum(not v.valid for v in stage_a)

        stage_b: dict[int, Verdict] = {}
        if self.prompt_b is not None:
            gated = [i for i, v in enumerate(stage_a) if v.valid and v.status in self.policy.gate]
            batch = [
                self.prompt_b.messages(items[i].question, items[i].rounds, items[i].references)
                for i in gated
            ]
            stage_b = dict(zip(gated, self._run(batch, stats), strict=True))
            stats.calls_b, stats.invalid_b = len(gated), sum(not v.valid for v in stage_b.values())

        top_m = max(self.prompt_a.top_m, self.prompt_b.top_m if self.prompt_b else 0)
        judgements = []
        for i, item in enumerate(items):
            final = merge_verdicts(
                stage_a[i],
                stage_b.get(i),
                item.references,
                evidence_text(item.rounds, top_m),
                self.policy.canonicalize,
            )
            judgements.append(Judgement(final, stage_a[i], stage_b.get(i)))
        stats.count_final([j.final for j in judgements])
        with self._totals_lock:  # judge may run in several threads (trainer's TeacherOverlap)
            self.totals.add(stats)
        return judgements, stats

    def _run(self, batch: list[Messages], stats: TeacherStats) -> list[Verdict]:
        if not batch:
            return []
        outputs = self.backend(batch)
        if len(outputs) != len(batch):
            raise ValueError(f"teacher backend returned {len(outputs)} outputs for {len(batch)}")
        verdicts = []
        for text, meta in outputs:
            stats.prompt_tokens += int(meta.get("prompt_tokens", 0))
            stats.completion_tokens += int(meta.get("completion_tokens", 0))
            stats.latency_s += float(meta.get("latency_s", 0.0))
            stats.cached += bool(meta.get("cached", False))
            if text is None:
                stats.failures += 1
                stats.wrong_model += bool(meta.get("wrong_model", False))
                verdicts.append(_invalid(f"client: {meta.get('error') or 'no text'}", True))
                continue
            verdict = parse_verdict(text)
            if not verdict.valid:  # broken however often asked: missing, not a zero
                stats.broken += 1
                verdict = replace(verdict, failed=True)
            verdicts.append(verdict)
        return verdicts
