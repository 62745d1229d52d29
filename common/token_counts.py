"""Tokens through the model per RL step, counted from the lengths the trainers already hold.

The metric names every trainer logs (summed over ranks by ``common.rl_loop.all_ranks_mean``):

- ``tokens/generation``: the rollout engine's tokens, as ``benchmarks/cost_model.py`` counts
  them: each group's prompt once (vLLM's prefix caching) plus every response token (sampled or
  inserted observation);
- ``tokens/reward``: tokens the method's own model forwards to compute the reward (CER's
  scoring forward; 0 for exact match and for an external teacher);
- ``tokens/update``: the policy's forward + backward, real tokens (``tokens/update_padded``:
  the micro-batches' padded positions; ``tokens/update_forwarded``: the real tokens the forwards
  ran, a prompt shared under ``loss.share_prompt`` once, the rows ``loss.skip_zero_advantage``
  leaves out not at all; ``update_rows``: the rows they ran); ``tokens/reference``: the
  reference model's forward (0 without a KL term);
- ``shape/groups``, ``shape/trajectories``, ``shape/prompt_tokens`` (each group's prompt once),
  ``shape/response_tokens``: the shapes the cost model counts for (``cost_model.measured_rows``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SUMMED_PREFIXES = ("tokens/", "shape/")  # counts: summed over ranks, not averaged


def rollout_token_metrics(trajs: Sequence[Any]) -> dict[str, int]:
    """``tokens/generation`` and the ``shape/*`` counts of a step's trajectories (objects with
    ``group_id``, ``prompt_ids`` and ``response_ids``)."""
    prompts: dict[str, int] = {}
    for t in trajs:
        prompts.setdefault(t.group_id, len(t.prompt_ids))
    response = sum(len(t.response_ids) for t in trajs)
    prompt = sum(prompts.values())
    return {
        "tokens/generation": prompt + response,
        "shape/groups": len(prompts),
        "shape/trajectories": len(trajs),
        "shape/prompt_tokens": prompt,
        "shape/response_tokens": response,
    }
