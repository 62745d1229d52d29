"""An agent trajectory as the rubric model and the teacher see it: a list of readable steps.

The policy's token-exact ``common.rollout.Trajectory`` stays the training record; an ``Episode``
is its text view (one ``AgentStep`` per sampled turn) for rubric prompts, teacher annotation and
the run folder's samples.

``agent_step`` is the one builder of steps, for the policy's rollouts (``episode_from_trajectory``)
and the LLM teacher's text episodes (``arco.teacher.teacher_rollouts``) alike, so that one play
gives one Episode, and one rubric prompt, whichever path it came by. As in the release, whose μ
reads its environment's ``action_history``, a step is the action and the environment's answer to
it: a search's documents as shown, the explanation after an invalid action. Never part of it:
the protocol's frame (``Observation: `` / ``<information>``), the budget statement, and the
forced-answer message before the last turn (an instruction for the next turn, not an answer to
this one).
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


def budget_before(turn: int, max_searches: int, forced: bool) -> int:
    """The budget before turn ``turn`` (0-based): every turn costs one unit, an invalid one too;
    0 on the forced-finish turn."""
    return 0 if forced else max(max_searches - turn, 0)


def agent_step(
    kind: str,
    action: str,
    observation: str,
    searches_left: int,
    forced: bool = False,
    doc_ids: tuple[str, ...] = (),
) -> AgentStep:
    """A step of the text view. ``observation``: the environment's answer alone (a search's
    documents as shown, the invalid-action explanation), kept only when the episode goes on
    after the step: an answer and the forced turn have none. Action and observation stripped."""
    ended = forced or kind == "answer"
    return AgentStep(
        kind,
        action.strip(),
        "" if ended else observation.strip(),
        searches_left,
        forced,
        tuple(doc_ids),
    )


def episode_from_trajectory(traj: Trajectory, tokenizer, max_searches: int) -> Episode:
    """The text view of ``traj``: each step's action is its sampled span, its observation what
    the agent loop recorded as the environment's answer (``Step.observation``: the documents as
    shown, the invalid-action explanation; never the inserted frame, budget statement or
    forced-answer message). R = exact match of the final answer (0 without one)."""
    ids = traj.response_ids
    steps = [
        agent_step(
            s.kind,
            tokenizer.decode(ids[s.start : s.end], skip_special_tokens=True),
            s.observation,
            budget_before(i, max_searches, s.forced),
            s.forced,
            tuple(d.id for d in s.docs),
        )
        for i, s in enumerate(traj.steps)
    ]
    reward = float(exact_match(traj.answer, traj.golden_answers)) if traj.answer else 0.0
    return Episode(
        traj.question_id, traj.question, list(traj.golden_answers), steps, traj.answer, reward
    )
