"""Step scorers from one method for another's trainer (``common.rewards.StepScorer``).

``TeacherEvidenceSteps`` scores a search agent's steps with EviBack's teacher, for ARCO's dense
phase in μ's place (``reward.step_scorer=experiments.step_scorers:TeacherEvidenceSteps``). The
teacher judges the evidence of each prefix of a trajectory that ends at a search step; a step
earns EviBack's β when its search is the one after which the teacher first calls the evidence
sufficient (S or A), and the answer step earns the outcome:

    s_t = β · (sup(τ_≤t) − sup(τ_<t))   t a search step, sup = 1[the teacher says S or A]
    s_t = EM(answer, gold)              t the answer step
    s_t = 0                             an invalid step

so Σ_t s_t = EM + β·sup(τ): the outcome, plus EviBack's supported bonus, credited to the search
that completed the evidence. With the evidence oracle (the tiny world's teacher, exact:
every supporting document retrieved) sup never falls as a trajectory goes on; a model teacher
may call a longer prefix insufficient again, and s_t is then −β there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common.metrics import exact_match
from common.rewards import Group, RewardContext
from eviback.oracle import EvidenceOracle
from eviback.prompts import rounds_from_trajectory
from eviback.reward import is_supported
from eviback.teacher import TeacherItem


@dataclass
class TeacherEvidenceSteps:
    """One score per agent step from EviBack's teacher (module docstring). ``teacher``: any
    object with EviBack's ``judge(items) -> (judgements, stats)``; the evidence oracle over the
    top ``top_m`` documents of each round when None. ``ctx.examples``: the questions
    by id (their metadata: the oracle reads the supporting documents there)."""

    beta: float = 0.1
    top_m: int = 5
    teacher: Any = None

    def __call__(self, groups: Sequence[Group], ctx: RewardContext) -> list[list[float]]:
        examples = ctx.examples
        if examples is None:
            raise ValueError("TeacherEvidenceSteps needs ctx.examples (the questions by id)")
        teacher = self.teacher if self.teacher is not None else EvidenceOracle(self.top_m)
        trajs = [t for g in groups for t in g.trajectories]
        items: list[TeacherItem] = []
        asked: list[list[int]] = []  # per trajectory: the step index of each prefix asked
        for t in trajs:
            rounds = rounds_from_trajectory(t)
            search_steps = [
                k for k, s in enumerate(t.steps) if s.kind == "search" and s.query is not None
            ]
            meta = examples[t.question_id].metadata
            for r in range(1, len(rounds) + 1):
                items.append(TeacherItem(t.question, rounds[:r], t.golden_answers, meta))
            asked.append(search_steps)
        judgements = teacher.judge(items)[0] if items else []
        sup = iter(float(is_supported(j.final)) for j in judgements)
        out: list[list[float]] = []
        for t, steps in zip(trajs, asked, strict=True):
            scores = [0.0] * len(t.steps)
            before = 0.0
            for k in steps:
                now = next(sup)
                scores[k] = self.beta * (now - before)
                before = now
            for k, s in enumerate(t.steps):
                if s.kind == "answer":
                    scores[k] = float(exact_match(t.answer, t.golden_answers))
            out.append(scores)
        return out
