"""Rubrics for a batch: μ's prompts for every step of every trajectory, their criteria written by
the rollout engine under the rubric adapter in one call, and the head's step scores.

The prefix before each action is known once a rollout ends, so a batch's rubric prompts go to
the engine together (the release calls μ inside the rollout loop, step by step).

Forwards on the training model (``rubric.shared_prefix``): per row (``rubric_batch``: one row a
step, [prompt + criteria]) or per trajectory (``trunk_batch``: the trajectory's rows packed as
one trunk, the longest-sharing row whole, and each other row's tail after its branch point under
a block-causal mask, ``common.block_causal``). Both give every token of a row the same hidden
state, so the pooled features, scores and criteria log-probs are the same.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from arco.rubric_prompt import (
    format_criteria,
    parse_criteria,
    rubric_messages,
    rubric_prompt_ids,
)
from arco.steps import Episode
from common.block_causal import block_causal_mask, pack_tree, pad_trees
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


@dataclass
class TrunkBatch:
    """Rubric rows packed one group (a trajectory) a row: what ``ArcoModel.forward`` takes
    (``ids``, the additive block-causal ``mask`` [G, 1, N, N], ``positions``, ``pool`` [G, R, N]:
    row r of group g pools exactly its own row's tokens, ``logit_mask`` [G, N]: the packed
    positions that predict some row's criteria token), and how to read the outputs back per item:
    item i is row ``row[i]`` of group ``group[i]``; criteria token c (items in order, each row's
    in position order, as ``rubric_batch``'s criteria mask lists them) is predicted at row
    ``crit_at[c]`` of the logits ``x[logit_mask]``, belongs to item ``crit_item[c]`` and is
    token ``crit_target[c]``. ``tokens``: real packed tokens forwarded; ``row_tokens``: the
    tokens of the rows themselves (the per-row path's)."""

    ids: torch.Tensor
    mask: torch.Tensor
    positions: torch.Tensor
    pool: torch.Tensor
    logit_mask: torch.Tensor
    group: torch.Tensor
    row: torch.Tensor
    crit_at: torch.Tensor
    crit_item: torch.Tensor
    crit_target: torch.Tensor
    tokens: int
    row_tokens: int

    def item_scores(self, scores: torch.Tensor) -> torch.Tensor:
        """The head's [G, R, K] scores as [M, K], in item order."""
        return scores[self.group, self.row]

    def item_mean(self, values: torch.Tensor, n_items: int) -> torch.Tensor:
        """Per item the mean of its criteria tokens' ``values`` [C] -> [M] (0 without any)."""
        total = values.new_zeros(n_items).index_add(0, self.crit_item, values)
        count = torch.bincount(self.crit_item, minlength=n_items).clamp(min=1)
        return total / count


def _groups(items: Sequence[RubricItem], key: Callable[[RubricItem], object]) -> list[list[int]]:
    """Item indices grouped by ``key``, groups in order of first appearance."""
    out: dict[object, list[int]] = {}
    for i, it in enumerate(items):
        out.setdefault(key(it), []).append(i)
    return list(out.values())


def trunk_batch(
    items: Sequence[RubricItem],
    pad_id: int,
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
    key: Callable[[RubricItem], object] = lambda it: it.traj,
) -> TrunkBatch:
    """``items`` grouped by ``key`` (default: the trajectory), each group's [prompt + criteria]
    rows packed as one trunk and tails (``common.block_causal.pack_tree``), right-padded; the
    mask in ``dtype`` (the model's compute dtype)."""
    groups = _groups(items, key)
    trees = [pack_tree([items[i].input_ids for i in g]) for g in groups]
    ids, positions, segment, visible = pad_trees(trees, pad_id, "cpu")
    n_groups, width = ids.shape
    pool = torch.zeros((n_groups, max(len(g) for g in groups), width))
    logit_mask = torch.zeros((n_groups, width), dtype=torch.bool)
    group, row = [0] * len(items), [0] * len(items)
    needed: list[tuple[int, int, int, int]] = []  # (item, group, packed position, target)
    for g, (members, tree) in enumerate(zip(groups, trees, strict=True)):
        for r, i in enumerate(members):
            group[i], row[i] = g, r
            index = tree.index[r]
            pool[g, r, index] = 1.0
            it = items[i]
            if it.written:
                seq = it.input_ids
                for p in range(len(it.prompt_ids) - 1, len(seq) - 1):
                    needed.append((i, g, index[p], seq[p + 1]))
                    logit_mask[g, index[p]] = True
    needed.sort(key=lambda x: x[0])  # item order; stable, so each item's in position order
    rank = (logit_mask.flatten().cumsum(0) - 1).view(n_groups, width)
    crit_at = [int(rank[g, p]) for _, g, p, _ in needed]

    def long(x) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.long, device=device)

    return TrunkBatch(
        ids=ids.to(device),
        mask=block_causal_mask(segment, visible, dtype).to(device),
        positions=positions.to(device),
        pool=pool.to(device),
        logit_mask=logit_mask.to(device),
        group=long(group),
        row=long(row),
        crit_at=long(crit_at),
        crit_item=long([i for i, _, _, _ in needed]),
        crit_target=long([t for _, _, _, t in needed]),
        tokens=sum(len(t) for t in trees),
        row_tokens=sum(len(it.input_ids) for it in items),
    )


def compute_dtype(model) -> torch.dtype:
    """The dtype the backbone computes in (its input embeddings'): the block mask's dtype."""
    lm = getattr(model, "lm", model)
    return lm.get_input_embeddings().weight.dtype


def trajectory_chunks(items: Sequence[RubricItem], batch_size: int) -> list[list[int]]:
    """Indices of ``items`` in chunks of whole trajectories (``traj`` values, in order of first
    appearance), at most ``batch_size`` rows a chunk (a longer trajectory alone)."""
    chunks: list[list[int]] = []
    for g in _groups(items, lambda it: it.traj):
        if chunks and len(chunks[-1]) + len(g) <= batch_size:
            chunks[-1].extend(g)
        else:
            chunks.append(list(g))
    return chunks


@torch.no_grad()
def score_items(
    model, items: Sequence[RubricItem], pad_id: int, batch_size: int, shared: bool = False
) -> None:
    """d_t for every item from the current μ (eval mode, no gradient), written into the items;
    ``batch_size`` rows a forward. ``shared``: the trunk path (``trunk_batch``), whole
    trajectories a forward."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        if shared:
            for where in trajectory_chunks(items, batch_size):
                chunk = [items[i] for i in where]
                tb = trunk_batch(chunk, pad_id, device, compute_dtype(model))
                _, scores = model(
                    "rubric", tb.ids, tb.mask, pool_mask=tb.pool, position_ids=tb.positions
                )
                for it, row in zip(chunk, tb.item_scores(scores).tolist(), strict=True):
                    it.scores = row
            return
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
