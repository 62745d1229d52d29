"""The record of one agent rollout, token-exact."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from common.retrieval.base import Doc


@dataclass
class Step:
    """One sampled turn: its action and the token span it occupies in ``response_ids``."""

    kind: str  # "search" | "answer" | "invalid"
    start: int
    end: int  # exclusive
    query: str | None = None
    docs: list[Doc] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    forced: bool = False  # generated in the forced-answer turn
    # the documents the model saw after the observation limit (the last one's text possibly
    # cut); None = not recorded (all of ``docs``)
    seen: list[Doc] | None = None
    # the environment's answer to this turn as text: a search's documents as the model saw them
    # (cut where the observation limit cut them), the invalid-action explanation; without the
    # protocol's frame, the budget statement or the forced-answer message. "" when nothing
    # answered the turn (an answer, the forced turn, an episode ended).
    observation: str = ""

    @property
    def shown_docs(self) -> list[Doc]:
        """What the model saw of this search's documents."""
        return list(self.docs) if self.seen is None else list(self.seen)


@dataclass
class Trajectory:
    """Prompt ids, then ``response_ids`` = sampled and inserted ids in order of appearance.

    ``loss_mask[i]`` is 1 exactly when ``response_ids[i]`` was sampled by the policy;
    ``sampling_logprobs[i]`` is the engine's logprob for sampled ids and 0 for inserted ones.
    """

    group_id: str
    sample_index: int
    question_id: str
    question: str
    golden_answers: list[str]
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    sampling_logprobs: list[float] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    answer: str | None = None
    num_invalid: int = 0
    used_forced_turn: bool = False  # reached the forced-answer turn
    forced_terminated: bool = False  # ended without an answer
    num_searches: int = 0
    num_duplicate_queries: int = 0
    done: bool = False

    def append(self, ids: list[int], sampled: bool, logprobs: list[float] | None = None) -> None:
        self.response_ids.extend(ids)
        self.loss_mask.extend([1 if sampled else 0] * len(ids))
        if sampled:
            if logprobs is None or len(logprobs) != len(ids):
                raise ValueError("sampled ids need one logprob each")
            self.sampling_logprobs.extend(logprobs)
        else:
            self.sampling_logprobs.extend([0.0] * len(ids))

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    @property
    def queries(self) -> list[str]:
        return [s.query for s in self.steps if s.kind == "search" and s.query is not None]

    def to_json(self, tokenizer=None) -> dict:
        """A readable dict for run-directory samples (with the decoded text when given a tokenizer)."""
        d = asdict(self)
        for step in d["steps"]:  # asdict keeps the Doc named tuples, which JSON writes as lists
            step["docs"] = [doc._asdict() for doc in step["docs"]]
            if step["seen"] is not None:
                step["seen"] = [doc._asdict() for doc in step["seen"]]
        if tokenizer is not None:
            d["prompt_text"] = tokenizer.decode(self.prompt_ids, skip_special_tokens=False)
            d["response_text"] = tokenizer.decode(self.response_ids, skip_special_tokens=False)
        return d

    @classmethod
    def from_json(cls, d: dict) -> Trajectory:
        d = {k: v for k, v in d.items() if k not in ("prompt_text", "response_text")}
        steps = [
            Step(
                **{
                    **s,
                    "docs": [Doc(**doc) for doc in s["docs"]],
                    "seen": None if s.get("seen") is None else [Doc(**doc) for doc in s["seen"]],
                }
            )
            for s in d.pop("steps")
        ]
        return cls(**d, steps=steps)
