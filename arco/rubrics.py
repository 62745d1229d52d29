"""Rubrics for a batch: μ's prompts for every step of every trajectory, their criteria written by
the rollout engine under the rubric adapter in one call, and the head's step scores.

The prefix before each action is known once a rollout ends, so a batch's rubric prompts go to
the engine together (the release calls μ inside the rollout loop, step by step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from arco.rubric_prompt import (
    format_criteria,
    parse_criteria,
    rubric_messages,
    rubric_prompt_ids,
)
from arco.steps import Episode
from common.rollout.agent import encode_text
from common.rollout.engine import SamplingConfig


@dataclass
class RubricItem:
    """μ's view of one step: prompt ids, the criteria it wrote (ids, parsed), its scores."""

    traj: int  # index of the trajectory in the batch
    step: int
    prompt_ids: list[int]
    criteria_ids: list[int] = field(default_factory=list)  # generated, ending with EOS
    criteria: list[str] | None = None  # None: invalid rubric (not exactly K non-empty)
    scores: list[float] = field(default_factory=list)  # d_t, K values in [-1, 1]
    target_scores: list[float] | None = None  # warmup: the projected teacher scores
    written: bool = True  # criteria are μ's to write (mode adaptive); False: fixed or none

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_ids + self.criteria_ids

    @property
    def step_reward(self) -> float:
        """s_t = mean_k d_{t,k}."""
        return sum(self.scores) / len(self.scores)


def rubric_items(
    episodes: Sequence[Episode],
    tokenizer,
    k: int,
    prefix: str = "before",
    max_obs_chars: int = 0,
    mode: str = "adaptive",
    fixed: Sequence[str] | None = None,
    **templates: str,
) -> list[RubricItem]:
    """One item per step of every episode, trajectory-major (``templates``: ``task``,
    ``system``, ``request`` for ``rubric_messages``).

    ``mode``: ``adaptive`` leaves the criteria for μ to write; ``fixed`` gives every item the
    criteria ``fixed`` (JSON + EOS, as μ would write them); ``none`` drops the request from the
    prompt and gives no criteria, so the head scores the prompt alone.
    """
    if mode == "none":
        templates = {**templates, "request": ""}
    preset: list[int] = []
    if mode == "fixed":
        if fixed is None or len(fixed) != k:
            raise ValueError(f"rubric mode fixed needs {k} criteria, got {fixed!r}")
        preset = encode_text(tokenizer, format_criteria(fixed)) + [tokenizer.eos_token_id]
    items = []
    for i, ep in enumerate(episodes):
        steps = ep.steps
        if max_obs_chars:
            steps = [replace(s, observation=s.observation[:max_obs_chars]) for s in steps]
        for t in range(len(steps)):
            messages = rubric_messages(ep.question, steps, t, k, prefix, **templates)
            item = RubricItem(i, t, rubric_prompt_ids(tokenizer, messages))
            if mode != "adaptive":
                item.written = False
                item.criteria_ids = list(preset)
                item.criteria = list(fixed) if mode == "fixed" else []
            items.append(item)
    return items


def write_criteria(
    engine, items: Sequence[RubricItem], k: int, max_new_tokens: int, eos_id: int
) -> int:
    """Greedy criteria for every item in one engine call under the ``rubric`` adapter; returns
    how many rubrics are invalid (kept, scored as written, and counted)."""
    params = SamplingConfig(n=1, temperature=0.0, max_tokens=max_new_tokens)
    outs = engine.generate([it.prompt_ids for it in items], params, adapter="rubric")
    invalid = 0
    for it, out in zip(items, outs, strict=True):
        ids = list(out[0].token_ids)
        if not ids or ids[-1] != eos_id:
            ids.append(eos_id)
        it.criteria_ids = ids
        it.criteria = parse_criteria(out[0].text, k)
        invalid += it.criteria is None
    return invalid


def rubric_batch(
    items: Sequence[RubricItem], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded [prompt + criteria] ids, the attention mask (= the pooling mask) [B, T], and
    the criteria mask [B, T-1] (1 where position t predicts a criteria token μ writes; all 0 for
    an item whose criteria are not μ's: fixed or none)."""
    width = max(len(it.input_ids) for it in items)
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(items), width), dtype=torch.long)
    crit = torch.zeros((len(items), width - 1))
    for r, it in enumerate(items):
        seq = it.input_ids
        ids[r, : len(seq)] = torch.tensor(seq)
        attn[r, : len(seq)] = 1
        if it.written:
            crit[r, len(it.prompt_ids) - 1 : len(seq) - 1] = 1.0
    return ids.to(device), attn.to(device), crit.to(device)


@torch.no_grad()
def score_items(model, items: Sequence[RubricItem], pad_id: int, batch_size: int) -> None:
    """d_t for every item from the current μ (eval mode, no gradient), written into the items."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(items), batch_size):
            chunk = items[start : start + batch_size]
            ids, attn, _ = rubric_batch(chunk, pad_id, device)
            _, scores = model("rubric", ids, attn, pool_mask=attn)
            for it, row in zip(chunk, scores.tolist(), strict=True):
                it.scores = row
    finally:
        model.train(was_training)


def step_rewards(items: Sequence[RubricItem], n_trajs: int) -> list[list[float]]:
    """s_t per trajectory, in step order."""
    out: list[list[float]] = [[] for _ in range(n_trajs)]
    for it in items:
        out[it.traj].append(it.step_reward)
    return out
