"""Fill CER's matrices: log pi(x | prompt + s_j) for the reference and every distinct answer x.

A scoring function ``score_fn(prefixes, continuations) -> per-token logprobs`` is what the rollout
engines expose (``engine.score``); with vLLM, prefix caching shares the prefix work. For plain HF
models this module gives two: ``hf_prefix_scorer`` (one forward per distinct prefix, its KV cache
reused for all of that prefix's continuations) and ``naive_scorer`` (each pair from scratch, the
public release's way; kept as the benchmark's baseline and as a check).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import DynamicCache

from cer.answer import AnswerSplit, continuation_ids

ScoreFn = Callable[[list[list[int]], list[list[int]]], list[list[float]]]


def score_group(
    score_fn: ScoreFn,
    prompt_ids: Sequence[int],
    splits: Sequence[AnswerSplit],
    reference: str,
    tokenizer: Any,
    m: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
    """Score one group (one prompt, its G responses split by ``cer.answer.solution_split``).

    For each of the first ``m`` solutions s_j (all when None) the prefix is ``prompt_ids +
    s_j.solution_ids`` and the continuations are the reference and every distinct answer (equal
    strings scored once), each as ``continuation_ids(s_j, x)``: tail + x + closing brace. A
    continuation's log probability is the sum of its token logprobs (temperature 1, no length
    normalisation). One ``score_fn`` call carries all pairs, those of a prefix next to each other.

    Returns ``ref_logp`` [J] (float64), ``answer_logp`` [J, U] (float64), ``answer_of_sample``
    [G] (long; -1 for a response without an answer) and the U distinct answers in order of first
    appearance: the inputs of ``cer.reward.cer_from_logprobs``.
    """
    distinct: list[str] = []
    for split in splits:
        if split.answer is not None and split.answer not in distinct:
            distinct.append(split.answer)
    answer_of_sample = torch.tensor(
        [-1 if s.answer is None else distinct.index(s.answer) for s in splits], dtype=torch.long
    )
    candidates = [reference] + [a for a in distinct if a != reference]
    solutions = list(splits[:m])
    prefixes, continuations = [], []
    for split in solutions:
        prefix = list(prompt_ids) + list(split.solution_ids)
        for x in candidates:
            prefixes.append(prefix)
            continuations.append(continuation_ids(split, x, tokenizer))
    token_logps = score_fn(prefixes, continuations)
    if len(token_logps) != len(prefixes):
        raise ValueError(f"score_fn returned {len(token_logps)} results for {len(prefixes)} pairs")
    sums = torch.tensor([sum(lp) for lp in token_logps], dtype=torch.float64)
    sums = sums.view(len(solutions), len(candidates))  # [J, 1 + answers other than reference]
    columns = [candidates.index(a) for a in distinct]
    return sums[:, 0], sums[:, columns], answer_of_sample, distinct


def _model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def hf_prefix_scorer(model: torch.nn.Module, batch_size: int = 32) -> ScoreFn:
    """A ``score_fn`` that forwards every distinct prefix once and scores all continuations on
    the prefixes' KV cache.

    Prefixes go through the model ``batch_size`` at a time, left-padded; each batch of
    continuations (right-padded) then attends to its own prefix's cache rows, with the padding
    masked and positions continuing from the prefix's length. Causal attention means padding
    after a token never changes its logits. Runs under ``torch.no_grad``.
    """

    @torch.no_grad()
    def score(prefixes: list[list[int]], continuations: list[list[int]]) -> list[list[float]]:
        device = _model_device(model)
        distinct: dict[tuple[int, ...], int] = {}
        for prefix in prefixes:
            if not prefix:
                raise ValueError("hf_prefix_scorer: a prefix is empty (score needs a context)")
            distinct.setdefault(tuple(prefix), len(distinct))
        pair_prefix = [distinct[tuple(p)] for p in prefixes]
        out: list[list[float]] = [[] for _ in prefixes]
        keys = list(distinct)
        for start in range(0, len(keys), batch_size):
            group = keys[start : start + batch_size]
            width = max(len(p) for p in group)
            ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in group], device=device)
            mask = (
                torch.arange(width, device=device)
                >= width - torch.tensor([len(p) for p in group], device=device)[:, None]
            ).long()  # [P, W]
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            pre = model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=pos,
                use_cache=True,
                logits_to_keep=1,
            )
            first = torch.log_softmax(pre.logits[:, -1].float(), -1)  # [P, V]
            layers = [(layer.keys, layer.values) for layer in pre.past_key_values.layers]
            local = {start + j: j for j in range(len(group))}
            pairs = [i for i, c in enumerate(continuations) if c and pair_prefix[i] in local]
            for chunk in _chunks(pairs, batch_size):
                rows = torch.tensor([local[pair_prefix[i]] for i in chunk], device=device)
                conts = [continuations[i] for i in chunk]
                cont_ids = _right_padded(conts, device)  # [B, Lc]
                lc = cont_ids.shape[1]
                cache = DynamicCache(ddp_cache_data=[(k[rows], v[rows]) for k, v in layers])
                full_mask = torch.cat([mask[rows], torch.ones_like(cont_ids)], dim=1)
                cont_pos = mask[rows].sum(-1, keepdim=True) + torch.arange(lc, device=device)
                logits = model(
                    input_ids=cont_ids,
                    attention_mask=full_mask,
                    position_ids=cont_pos,
                    past_key_values=cache,
                    use_cache=True,
                ).logits
                logp = torch.log_softmax(logits.float(), -1)  # [B, Lc, V]
                for b, (i, cont) in enumerate(zip(chunk, conts, strict=True)):
                    rest = logp[
                        b, torch.arange(len(cont) - 1, device=device), cont_ids[b, 1 : len(cont)]
                    ]
                    out[i] = [first[rows[b], cont[0]].item(), *rest.tolist()]
        return out

    return score


def naive_scorer(model: torch.nn.Module, batch_size: int = 32) -> ScoreFn:
    """A ``score_fn`` that forwards every ``prefix + continuation`` from scratch, ``batch_size``
    pairs at a time (right-padded), with the LM head applied only where a continuation token is
    predicted."""
    decoder, lm_head = model.get_decoder(), model.get_output_embeddings()

    @torch.no_grad()
    def score(prefixes: list[list[int]], continuations: list[list[int]]) -> list[list[float]]:
        device = _model_device(model)
        out: list[list[float]] = [[] for _ in prefixes]
        pairs = [i for i, c in enumerate(continuations) if c]
        for chunk in _chunks(pairs, batch_size):
            if any(not prefixes[i] for i in chunk):
                raise ValueError("naive_scorer: a prefix is empty (score needs a context)")
            seqs = [prefixes[i] + continuations[i] for i in chunk]
            ids = _right_padded(seqs, device)
            hidden = decoder(input_ids=ids).last_hidden_state  # [B, L, H]
            for b, i in enumerate(chunk):
                n_pre, n_cont = len(prefixes[i]), len(continuations[i])
                positions = torch.arange(n_pre - 1, n_pre + n_cont - 1, device=device)
                logp = torch.log_softmax(lm_head(hidden[b, positions]).float(), -1)  # [Lc, V]
                targets = ids[b, positions + 1]
                out[i] = logp[torch.arange(n_cont, device=device), targets].tolist()
        return out

    return score


def _right_padded(seqs: list[list[int]], device: torch.device) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    return torch.tensor([s + [0] * (width - len(s)) for s in seqs], device=device)


def _chunks(items: list[int], size: int) -> list[list[int]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
