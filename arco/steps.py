"""An agent trajectory as the rubric model and the teacher see it: a list of readable steps.

The policy's token-exact ``common.rollout.Trajectory`` stays the training record; an ``Episode``
is its text view (one ``AgentStep`` per sampled turn) for rubric prompts, teacher annotation and
the run folder's samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.metrics import exact_match
from common.rollout.trajectory import Trajectory


@dataclass(frozen=True)
class AgentStep:
    """One action of the agent and what the environment answered.

    ``searches_left`` is the budget before the action (each turn costs one unit, invalid ones
    too; 0 on the forced-finish turn); ``observation`` is the text the environment inserted after
    the action ("" after the last one).
    """

    kind: str  # "search" | "answer" | "invalid"
    action: str
    observation: str
    searches_left: int
    forced: bool = False
    doc_ids: tuple[str, ...] = ()  # ids of the documents a search returned


@dataclass
class Episode:
    """A whole trajectory in text: the question, its steps, the final answer and reward R."""

    question_id: str
    question: str
    golden_answers: list[str]
    steps: list[AgentStep]
    answer: str | None
    reward: float
    metadata: dict = field(default_factory=dict)


def episode_from_trajectory(traj: Trajectory, tokenizer, max_searches: int) -> Episode:
    """The text view of ``traj``: each step's action is its sampled span, its observation the
    inserted ids up to the next step. R = exact match of the final answer (0 without one)."""
    ids = traj.response_ids
    steps = []
    for i, s in enumerate(traj.steps):
        end_obs = traj.steps[i + 1].start if i + 1 < len(traj.steps) else len(ids)
        steps.append(
            AgentStep(
                kind=s.kind,
                action=tokenizer.decode(ids[s.start : s.end], skip_special_tokens=True).strip(),
                observation=tokenizer.decode(
                    ids[s.end : end_obs], skip_special_tokens=True
                ).strip(),
                searches_left=0 if s.forced else max(max_searches - i, 0),
                forced=s.forced,
                doc_ids=tuple(d.id for d in s.docs),
            )
        )
    reward = float(exact_match(traj.answer, traj.golden_answers)) if traj.answer else 0.0
    return Episode(
        traj.question_id, traj.question, list(traj.golden_answers), steps, traj.answer, reward
    )
