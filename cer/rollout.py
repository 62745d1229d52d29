"""Single-turn sampling: G responses per prompt, kept as the sampled token ids, split at the box."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cer.config import CERConfig
from cer.data import MathExample
from cer.rewards.answer import response_split
from cer.rewards.groups import Group
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


def prompt_seeds(
    seed: int, step: int, rank: int, world: int, n_prompts: int, group_size: int
) -> list[int]:
    """One sampling seed per prompt of a training step on one rank, ``group_size`` apart.

    vLLM seeds sample k of a request with seed ``s + k``: with the seeds spaced ``group_size``
    apart over (step, rank, prompt), every sample of the run has a seed of its own: the k-th
    samples of two prompts never share a random stream, nor does step t+1 reuse step t's. The
    run's ``seed`` moves the whole range (by 2**40 seeds per unit).
    """
    if seed < 0 or step < 0 or not 0 <= rank < world:
        raise ValueError(f"prompt_seeds: bad seed/step/rank {seed}/{step}/{rank} (world {world})")
    first = (step * world + rank) * n_prompts
    return [(seed << 40) + (first + i) * group_size for i in range(n_prompts)]


def step_sampling(
    cfg: CERConfig, step: int, rank: int, world: int, n_prompts: int
) -> SamplingConfig:
    """The sampling of one training step on one rank: G samples per prompt at the run's
    temperature, with ``prompt_seeds`` (the HF engine seeds the call with the first)."""
    seeds = prompt_seeds(cfg.seed, step, rank, world, n_prompts, cfg.group_size)
    s = cfg.sampling
    return SamplingConfig(
        n=cfg.group_size,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        max_tokens=cfg.max_response_tokens,
        seed=seeds[0],
        prompt_seeds=seeds,
    )


def sample_groups(
    engine: GenerationEngine,
    tokenizer: Any,
    examples: Sequence[MathExample],
    prompts: Sequence[list[int]],
    params: SamplingConfig,
    group_prefix: str = "",
) -> list[Group]:
    """``params.n`` responses for each example (one ``generate`` call), each split at its last
    box (``solution_split``: a response without one keeps answer None), or a short-answer row's
    taken whole (``short_answer_split``)."""
    params.stop_token_ids = sorted(set(params.stop_token_ids) | set(stop_token_ids(tokenizer)))
    outs = engine.generate([list(p) for p in prompts], params)
    groups = []
    for i, (ex, prompt, comps) in enumerate(zip(examples, prompts, outs, strict=True)):
        trajs, splits = [], []
        short = bool(ex.metadata.get("short_answer"))
        for k, c in enumerate(comps):
            t = Trajectory(f"{group_prefix}{i}", k, ex.id, ex.problem, [ex.answer], list(prompt))
            t.append(list(c.token_ids), sampled=True, logprobs=list(c.logprobs))
            split = response_split(list(c.token_ids), tokenizer, short)
            t.answer, t.done = split.answer, True
            trajs.append(t)
            splits.append(split)
        # a short answer's solution ends in tokens the engine did not sample: no cache to reuse
        kvs = [None if short else c.kv for c in comps]
        groups.append(Group(ex, list(prompt), trajs, splits, kvs if any(kvs) else None))
    return groups
