"""Single-turn sampling: G responses per prompt, kept as the sampled token ids, split at the box."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cer.answer import solution_split
from cer.data import MathExample
from cer.group_reward import Group
from common.rollout.engine import GenerationEngine, SamplingConfig
from common.rollout.trajectory import Trajectory

END_OF_TURN = "<|im_end|>"


def stop_token_ids(tokenizer: Any) -> list[int]:
    """The end-of-text id and the chat end-of-turn id (a base model may write either)."""
    ids = {tokenizer.eos_token_id}
    turn = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if isinstance(turn, int) and turn != tokenizer.unk_token_id:
        ids.add(turn)
    return sorted(i for i in ids if i is not None)


def sample_groups(
    engine: GenerationEngine,
    tokenizer: Any,
    examples: Sequence[MathExample],
    prompts: Sequence[list[int]],
    params: SamplingConfig,
    group_prefix: str = "",
) -> list[Group]:
    """``params.n`` responses for each example (one ``generate`` call), each split at its last
    box (``solution_split``: a response without one keeps answer None)."""
    params.stop_token_ids = sorted(set(params.stop_token_ids) | set(stop_token_ids(tokenizer)))
    outs = engine.generate([list(p) for p in prompts], params)
    groups = []
    for i, (ex, prompt, comps) in enumerate(zip(examples, prompts, outs, strict=True)):
        trajs, splits = [], []
        for k, c in enumerate(comps):
            t = Trajectory(f"{group_prefix}{i}", k, ex.id, ex.problem, [ex.answer], list(prompt))
            t.append(list(c.token_ids), sampled=True, logprobs=list(c.logprobs))
            split = solution_split(list(c.token_ids), tokenizer)
            t.answer, t.done = split.answer, True
            trajs.append(t)
            splits.append(split)
        kvs = [c.kv for c in comps]
        groups.append(Group(ex, list(prompt), trajs, splits, kvs if any(kvs) else None))
    return groups
