"""ARCO's tokens through the model per step, from the lengths the trainer holds
(``common.token_counts`` names them): π's generation and update (+ π_ref's forward on the steps
with its KL term), and μ's rows (rubric prompt + criteria, each counted whole)."""

from __future__ import annotations

from collections.abc import Sequence

from arco.rubrics import RubricItem
from common.block_causal import pack_tree
from common.rollout import Trajectory
from common.token_counts import rollout_token_metrics


def arco_token_metrics(
    trajs: Sequence[Trajectory],
    items: Sequence[RubricItem],
    pi_reference: bool,
    shared_prefix: bool = False,
) -> dict[str, int]:
    """``tokens/generation`` and ``shape/*`` (π's rollouts); ``tokens/update``: π's rows
    (prompt + response, the update's attention mask); ``tokens/reference``: the same again where
    ``pi_reference`` (π_ref's forward, the KL term on); ``tokens/rubric_generation``: the rubric
    prompts and the criteria μ wrote (every prompt whole: vLLM's prefix cache is not read);
    ``tokens/mu_rows``: μ's rows (prompt + criteria) whole, once; ``tokens/mu_packed``: the same
    rows as one of μ's forwards takes them: under ``shared_prefix`` (``rubric.shared_prefix``)
    each trajectory's rows packed as a trunk and tails (``common.block_causal.pack_tree``, as
    ``arco.rubrics.trunk_batch`` packs them), otherwise ``tokens/mu_rows`` (how many forwards
    a step makes, scoring, update, μ_ref, is not counted here)."""
    update = sum(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
    written = [it for it in items if it.written]
    rows = sum(len(it.input_ids) for it in items)
    return rollout_token_metrics(trajs) | {
        "tokens/update": update,
        "tokens/reference": update if pi_reference else 0,
        "tokens/rubric_generation": sum(len(it.input_ids) for it in written),
        "tokens/mu_rows": rows,
        "tokens/mu_packed": mu_packed_tokens(items) if shared_prefix else rows,
    }


def mu_packed_tokens(items: Sequence[RubricItem]) -> int:
    """The tokens of ``items`` packed per trajectory as one trunk and its rows' tails."""
    by_traj: dict[int, list[list[int]]] = {}
    for it in items:
        by_traj.setdefault(it.traj, []).append(it.input_ids)
    return sum(len(pack_tree(rows).ids) for rows in by_traj.values())
