"""Fill CER's matrices: log pi(x | prompt + s_j) for the reference and every distinct answer x.

A scoring function ``score_fn(prefixes, continuations) -> per-token logprobs`` fills them. The
trainer's is ``hf_prefix_scorer`` on the training model: the prompt a group's solutions share is
forwarded once, each solution once, and every answer on the solution's cache. ``naive_scorer``
forwards each pair from scratch (the public release's way; the benchmark's baseline and a check),
as the engines' own ``score`` methods do: vLLM (0.32) reads no prefix cache for a request with
prompt logprobs (``SamplingParams.skip_reading_prefix_cache``), so each pair is a full prefill.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch
from transformers import DynamicCache

from cer.rewards.answer import AnswerSplit, closing_alternatives, continuation_ids
from cer.rewards.expectation import select_solutions
from common.rollout.engine import GeneratedKV
from common.train.distributed import all_reduce_values
from common.train.engine import eval_mode

T = TypeVar("T")
Alternatives = Sequence[Sequence[int] | None]
Generated = tuple[GeneratedKV, int]  # a generation's cache, and how many response tokens count


class ScoreFn(Protocol):
    """Per-token log probabilities of each continuation after its prefix. With
    ``last_alternatives[i]`` given, continuation i's last value is the log of the summed
    probability of those tokens (which include its own last token) instead of that token's.
    ``generated[i]`` (optional, a scorer may ignore it): the sampling engine's cache for pair
    i's prefix, which is its prompt and the first n tokens of that sampled response."""

    def __call__(
        self,
        prefixes: list[list[int]],
        continuations: list[list[int]],
        last_alternatives: Alternatives | None = None,
        generated: Sequence[Generated | None] | None = None,
    ) -> list[list[float]]: ...


def ignoring_alternatives(score: Callable[[list[list[int]], list[list[int]]], list[list[float]]]):
    """A two-argument scorer (an engine's ``score``) as a ``ScoreFn``: it scores each
    continuation's own last token only (the closing brace alone, not ``"}."`` and the like)."""

    def score_fn(prefixes, continuations, last_alternatives=None, generated=None):
        return score(prefixes, continuations)

    return score_fn


@dataclass
class GroupPairs:
    """The (prefix, continuation) pairs of one group, and how their scores become matrices."""

    prefixes: list[list[int]]
    continuations: list[list[int]]
    alternatives: list[tuple[int, ...] | None]
    generated: list[Generated | None]
    solutions: int
    candidates: list[str]  # the reference first, then the other distinct answers
    distinct: list[str]
    answer_of_sample: torch.Tensor
    rows: list[int]  # the samples whose solutions are scored, in order
    counted: torch.Tensor  # [len(rows), U] bool: the solutions CER averages over, per answer

    def matrices(
        self, token_logps: list[list[float]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
        """``ref_logp`` [J], ``answer_logp`` [J, U], ``answer_of_sample`` [G], the U answers."""
        if len(token_logps) != len(self.prefixes):
            raise ValueError(
                f"score_fn returned {len(token_logps)} results for {len(self.prefixes)} pairs"
            )
        sums = torch.tensor([sum(lp) for lp in token_logps], dtype=torch.float64)
        sums = sums.view(self.solutions, len(self.candidates))  # [J, 1 + other answers]
        columns = [self.candidates.index(a) for a in self.distinct]
        return sums[:, 0], sums[:, columns], self.answer_of_sample, self.distinct


def group_pairs(
    prompt_ids: Sequence[int],
    splits: Sequence[AnswerSplit],
    reference: str,
    tokenizer: Any,
    m: int | None = None,
    kvs: Sequence[GeneratedKV | None] | None = None,
    selection: str = "first",
    all_solutions: bool = False,
) -> GroupPairs:
    """The pairs ``score_group`` scores (see there); ``all_solutions``: score every solution
    (VeriFree needs each sample's own) while CER still counts only the selected ones."""
    distinct: list[str] = []
    for split in splits:
        if split.answer is not None and split.answer not in distinct:
            distinct.append(split.answer)
    answer_of_sample = torch.tensor(
        [-1 if s.answer is None else distinct.index(s.answer) for s in splits], dtype=torch.long
    )
    candidates = [reference] + [a for a in distinct if a != reference]
    counted = select_solutions(answer_of_sample, len(distinct), m, selection)  # [G, U]
    if all_solutions:
        rows = list(range(len(splits)))
    elif distinct:
        rows = [j for j in range(len(splits)) if counted[j].any()]
    else:  # no answer to average for: the first m solutions still give pi(a*|s) statistics
        rows = list(range(len(splits)))[:m]
    pairs = GroupPairs(
        [], [], [], [], len(rows), candidates, distinct, answer_of_sample, rows, counted[rows]
    )
    # Solutions mostly share their tail ("" or "{"): encode each continuation text once.
    encoded: dict[tuple[str, str], tuple[list[int], tuple[int, ...] | None]] = {}
    for j in rows:
        split = splits[j]
        prefix = list(prompt_ids) + list(split.solution_ids)
        kv, n = (kvs[j] if kvs is not None else None), len(split.solution_ids)
        for x in candidates:
            key = (split.continuation_text(x), split.closing)
            if key not in encoded:
                cont = continuation_ids(split, x, tokenizer)
                encoded[key] = cont, closing_alternatives(split, cont, tokenizer)
            cont, alternatives = encoded[key]
            pairs.prefixes.append(prefix)
            pairs.continuations.append(list(cont))
            pairs.alternatives.append(alternatives)
            pairs.generated.append((kv, n) if kv is not None and kv.usable_for(n) else None)
    return pairs


def score_group(
    score_fn: ScoreFn,
    prompt_ids: Sequence[int],
    splits: Sequence[AnswerSplit],
    reference: str,
    tokenizer: Any,
    m: int | None = None,
    kvs: Sequence[GeneratedKV | None] | None = None,
    selection: str = "first",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
    """Score one group (one prompt, its G responses split by ``cer.rewards.answer.solution_split``).

    For each of the first ``m`` solutions s_j (all when None; ``selection="per_answer"``: the
    solutions ``cer.rewards.expectation.select_solutions`` picks for any answer, the rows of ``GroupPairs``
    then say which, and its ``counted`` mask which count for which answer) the prefix is ``prompt_ids +
    s_j.solution_ids`` and the continuations are the reference and every distinct answer (equal
    strings scored once), each as ``continuation_ids(s_j, x)``: tail + x + closing brace. A
    continuation's log probability is the sum of its token logprobs (temperature 1, no length
    normalisation), the closing brace counted as any token that starts with it when it stands
    alone (``closing_alternatives``). One ``score_fn`` call carries all pairs, those of a prefix
    next to each other. ``kvs[j]`` (optional): sample j's generation cache, passed on as
    ``generated`` so that a scorer can start after the solution instead of re-reading it.

    Returns ``ref_logp`` [J] (float64), ``answer_logp`` [J, U] (float64), ``answer_of_sample``
    [G] (long; -1 for a response without an answer) and the U distinct answers in order of first
    appearance: the inputs of ``cer.rewards.expectation.cer_from_logprobs``.
    """
    p = group_pairs(prompt_ids, splits, reference, tokenizer, m, kvs, selection)
    return p.matrices(score_fn(p.prefixes, p.continuations, p.alternatives, p.generated))


def _model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


@dataclass
class _Trunk:
    """Prefixes (indices into the distinct prefixes) that share their first ``length`` tokens."""

    length: int
    members: list[int]


def shared_trunks(prefixes: Sequence[Sequence[int]]) -> list[_Trunk]:
    """Cut the prefixes, in order, into runs that share their first tokens (a group's prompt).

    Forwarding a run's shared start once saves ``(members - 1) * length`` tokens; the cut is the
    one that saves the most (dynamic programming over the consecutive common starts, so a
    second prompt that only shares the chat template's first tokens gets its own run). A run's
    shared start stops at least one token before its shortest member, so every member has a
    suffix of its own whose last position predicts the continuations.
    """
    n = len(prefixes)
    common = [0] + [_common_length(prefixes[i - 1], prefixes[i]) for i in range(1, n)]
    best = [0] * (n + 1)  # best[b]: the most tokens saved on prefixes[:b]
    start = [0] * (n + 1)  # where the last run of that best cut starts
    length = [0] * (n + 1)  # and its shared length
    for b in range(1, n + 1):
        shared = len(prefixes[b - 1]) - 1
        best[b], start[b], length[b] = best[b - 1], b - 1, shared
        for a in range(b - 2, -1, -1):  # the run prefixes[a:b]
            shared = min(shared, common[a + 1], len(prefixes[a]) - 1)
            if shared <= 0:
                break  # a longer run saves nothing more
            if best[a] + (b - a - 1) * shared > best[b]:
                best[b], start[b], length[b] = best[a] + (b - a - 1) * shared, a, shared
    trunks: list[_Trunk] = []
    b = n
    while b > 0:
        trunks.append(_Trunk(length[b], list(range(start[b], b))))
        b = start[b]
    return trunks[::-1]


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _in_eval_mode(model: torch.nn.Module, score: ScoreFn) -> ScoreFn:
    """``score`` with ``model`` in eval mode while it runs: the training model is in training
    mode, where gradient checkpointing drops the cache the scorer continues from (and dropout
    would be on)."""

    @functools.wraps(score)
    def scored(*args: Any, **kwargs: Any) -> list[list[float]]:
        with eval_mode(model):
            return score(*args, **kwargs)

    return scored


def hf_prefix_scorer(
    model: torch.nn.Module, batch_size: int = 32, sync_ranks: bool = False
) -> ScoreFn:
    """A ``score_fn`` that forwards the part prefixes share (a group's prompt) once, each prefix's
    own suffix (its solution) once, and all continuations of a prefix in one row after it.

    Two kinds of forward, ``batch_size`` rows at a time: the trunks (``shared_trunks``; left-
    padded); then, on a copy of its trunk's cache rows, one row per prefix: its suffix (left-
    padded, so padding sits between trunk and suffix and is masked) followed by all of its
    continuations side by side, under a block-causal mask (each continuation sees the prefix and
    its own earlier tokens, never another continuation) with positions restarting after the
    prefix for each. Masked padding never changes a real token's logits. Runs under no_grad.

    ``sync_ranks``: every rank of the process group makes the same number of forward calls
    (padding with one-token forwards), as a ZeRO-3 partitioned model needs: each of its forwards
    gathers the parameters collectively, while ranks score different groups.
    """
    decoder, lm_head = model.get_decoder(), model.get_output_embeddings()
    calls = [0]

    def forward(ids, mask, positions, past=None):
        cache = DynamicCache(ddp_cache_data=past) if past is not None else DynamicCache()
        hidden = decoder(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state
        calls[0] += 1
        return hidden, [(layer.keys, layer.values) for layer in cache.layers]

    def head(hidden: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(lm_head(hidden).float(), -1)

    def positions_of(mask: torch.Tensor, width: int) -> torch.Tensor:
        return (mask.cumsum(-1) - 1).clamp(min=0)[:, -width:]

    @torch.inference_mode()
    def score(
        prefixes: list[list[int]],
        continuations: list[list[int]],
        last_alternatives: Alternatives | None = None,
        generated: Sequence[Generated | None] | None = None,
    ) -> list[list[float]]:
        device = _model_device(model)
        distinct: dict[tuple[int, ...], int] = {}
        for prefix in prefixes:
            if not prefix:
                raise ValueError("hf_prefix_scorer: a prefix is empty (score needs a context)")
            distinct.setdefault(tuple(prefix), len(distinct))
        keys = list(distinct)
        pairs_of: list[list[int]] = [[] for _ in keys]
        gen_of: dict[int, Generated] = {}
        for i, (prefix, cont) in enumerate(zip(prefixes, continuations, strict=True)):
            if cont:
                pairs_of[distinct[tuple(prefix)]].append(i)
                if generated is not None and generated[i] is not None and not sync_ranks:
                    gen_of[distinct[tuple(prefix)]] = generated[i]
        out: list[list[float]] = [[] for _ in prefixes]

        def collect(pairs: list[list[int]], logp: torch.Tensor, targets: torch.Tensor) -> None:
            """Rows of ``logp`` are the continuation tokens of ``pairs``, in order."""
            scores = logp[torch.arange(len(targets), device=device), targets].tolist()
            k, last_rows = 0, {}
            for pair_ids in pairs:
                for i in pair_ids:
                    out[i] = scores[k : k + len(continuations[i])]
                    k += len(continuations[i])
                    if last_alternatives is not None and last_alternatives[i] is not None:
                        last_rows[i] = k - 1
            _sum_last_alternatives(out, logp, last_rows, last_alternatives)

        width = {m: sum(len(continuations[i]) for i in pairs_of[m]) for m in gen_of}
        cached = sorted((m for m in gen_of if pairs_of[m]), key=width.__getitem__)
        # Rows of alike width together, and fewer of the widest: a forward of at most
        # batch_size rows and about batch_size rows of the median width in tokens.
        budget = batch_size * width[cached[len(cached) // 2]] if cached else 0
        for member_batch in _budget_chunks(cached, width, batch_size, budget):
            # Rows that continue a sampled response from the generation's own cache: no
            # prompt or solution forward at all, only the packed continuations.
            kvs = [gen_of[m] for m in member_batch]
            past, mask = _generated_past(kvs, device)
            first = torch.stack([torch.log_softmax(kv.logits[kv.row, n], -1) for kv, n in kvs])
            pairs = [pairs_of[m] for m in member_batch]
            packed = _packed_continuations([[continuations[i] for i in p] for p in pairs])
            cont_ids, segment, offset = (t.to(device) for t in packed)
            no_suffix = mask[:, :0]
            hidden, _ = forward(
                cont_ids,
                _scoring_mask(mask, no_suffix, segment, model.dtype),
                mask.sum(-1, keepdim=True) + offset,
                past,
            )
            r, col = torch.nonzero(segment >= 0, as_tuple=True)
            starts = offset[r, col] == 0
            logp = torch.empty(len(r), first.shape[-1], device=device)
            logp[starts] = first[r[starts]].to(logp.dtype)
            logp[~starts] = head(hidden[r[~starts], col[~starts] - 1])
            collect(pairs, logp, cont_ids[r, col])
        rest = [m for m in range(len(keys)) if m not in gen_of]
        trunks = [
            _Trunk(t.length, [rest[k] for k in t.members])
            for t in shared_trunks([keys[m] for m in rest])
            if any(pairs_of[rest[k]] for k in t.members)
        ]
        batches = _chunks(trunks, batch_size)
        planned = sum(
            any(t.length for t in tb)
            + len(_chunks([m for t in tb for m in t.members if pairs_of[m]], batch_size))
            for tb in batches
        )
        total = _max_over_ranks(planned) if sync_ranks else planned
        calls[0] = 0
        for trunk_batch in batches:
            ids, mask = _left_padded([keys[t.members[0]][: t.length] for t in trunk_batch], device)
            trunk_kv = None
            if ids.numel():
                hidden, trunk_kv = forward(ids, mask, positions_of(mask, ids.shape[1]))
                if sync_ranks:  # every call also runs the head: the same gathers on every rank
                    head(hidden[:1, -1])
            members = [(b, m) for b, t in enumerate(trunk_batch) for m in t.members if pairs_of[m]]
            # Rows of alike width together: less padding in the packed continuation rows.
            members.sort(key=lambda bm: sum(len(continuations[i]) for i in pairs_of[bm[1]]))
            for member_batch in _chunks(members, batch_size):
                rows = torch.tensor([b for b, _ in member_batch], device=device)
                suffixes = [keys[m][trunk_batch[b].length :] for b, m in member_batch]
                suf_ids, suf_mask = _left_padded(suffixes, device)
                past = None if trunk_kv is None else [(k[rows], v[rows]) for k, v in trunk_kv]
                pairs = [pairs_of[m] for _, m in member_batch]
                packed = _packed_continuations([[continuations[i] for i in p] for p in pairs])
                cont_ids, segment, offset = (t.to(device) for t in packed)
                trunk_mask, width = mask[rows], suf_ids.shape[1]
                prefix_len = trunk_mask.sum(-1, keepdim=True) + suf_mask.sum(-1, keepdim=True)
                hidden, _ = forward(
                    torch.cat([suf_ids, cont_ids], dim=1),
                    _scoring_mask(trunk_mask, suf_mask, segment, model.dtype),
                    torch.cat(
                        [
                            positions_of(torch.cat([trunk_mask, suf_mask], 1), width),
                            prefix_len + offset,
                        ],
                        dim=1,
                    ),
                    past,
                )
                # A continuation's token t is predicted by the column before it in the packed
                # part (its own token t - 1), its token 0 by the suffix's last column.
                r, col = torch.nonzero(segment >= 0, as_tuple=True)
                before = torch.where(offset[r, col] > 0, width + col - 1, width - 1)
                logp = head(hidden[r, before])
                collect(pairs, logp, cont_ids[r, col])
        if calls[0] != planned:
            raise RuntimeError(f"hf_prefix_scorer: planned {planned} forwards, made {calls[0]}")
        while calls[0] < total:  # this rank scored fewer batches than another
            one = torch.zeros(1, 1, dtype=torch.long, device=device)
            head(forward(one, torch.ones_like(one), torch.zeros_like(one))[0][:, -1])
        return out

    return _in_eval_mode(model, score)


def _sum_last_alternatives(
    out: list[list[float]],
    logp: torch.Tensor,
    last_rows: dict[int, int],
    alternatives: Alternatives | None,
) -> None:
    """For pair i, put logsumexp of ``logp[last_rows[i], alternatives[i]]`` as its last value."""
    by_set: dict[tuple[int, ...], list[int]] = {}
    for i in last_rows:
        by_set.setdefault(tuple(alternatives[i]), []).append(i)
    for alts, pairs in by_set.items():
        rows = torch.tensor([last_rows[i] for i in pairs], device=logp.device)
        cols = torch.tensor(alts, device=logp.device)
        values = torch.logsumexp(logp[rows][:, cols], dim=-1).tolist()
        for i, v in zip(pairs, values, strict=True):
            out[i][-1] = v


def _max_over_ranks(n: int) -> int:
    """The largest ``n`` over the ranks of the default process group (``n`` outside one)."""
    return int(all_reduce_values([n], op="max", dtype=torch.long)[0])


def _generated_past(
    kvs: Sequence[Generated], device: torch.device
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """The cache rows of generated prefixes (prompt + first n response tokens), right-aligned
    into one batch [M, heads, W, head_dim] per layer, and their mask [M, W]."""
    widths = [kv.prompt_mask.shape[0] + n for kv, n in kvs]
    width = max(widths)
    mask = torch.zeros(len(kvs), width, dtype=torch.long, device=device)
    layers = []
    for layer in range(len(kvs[0][0].layers)):
        k0, v0 = kvs[0][0].layers[layer]
        keys = k0.new_zeros(len(kvs), k0.shape[1], width, k0.shape[3])
        values = v0.new_zeros(len(kvs), v0.shape[1], width, v0.shape[3])
        for r, ((kv, _), w) in enumerate(zip(kvs, widths, strict=True)):
            k, v = kv.layers[layer]
            keys[r, :, width - w :] = k[kv.row, :, :w]
            values[r, :, width - w :] = v[kv.row, :, :w]
        layers.append((keys, values))
    for r, ((kv, n), w) in enumerate(zip(kvs, widths, strict=True)):
        mask[r, width - w : width - n] = kv.prompt_mask.to(device)
        mask[r, width - n :] = 1
    return layers, mask


def _packed_continuations(
    rows: list[list[list[int]]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's continuations side by side, right-padded: ids, segment (the continuation's index
    in its row, -1 for padding) and offset (the token's index in its continuation), all [M, L]."""
    width = max(sum(len(c) for c in conts) for conts in rows)
    ids, segment, offset = [], [], []
    for conts in rows:
        pad = width - sum(len(c) for c in conts)
        ids.append([t for c in conts for t in c] + [0] * pad)
        segment.append([j for j, c in enumerate(conts) for _ in c] + [-1] * pad)
        offset.append([t for c in conts for t in range(len(c))] + [0] * pad)
    ids, segment, offset = (torch.tensor(x, dtype=torch.long) for x in (ids, segment, offset))
    return ids, segment, offset


def _scoring_mask(
    trunk_mask: torch.Tensor, suffix_mask: torch.Tensor, segment: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Additive 4D mask [M, 1, S + L, T + S + L] for a row of suffix (S, left-padded) then packed
    continuations (L) after a cached trunk (T). Every query sees the trunk's real tokens; a
    suffix token sees the real suffix tokens up to itself; a continuation token sees the whole
    real suffix and the earlier tokens of its own continuation, never another continuation."""
    s, length, device = suffix_mask.shape[1], segment.shape[1], segment.device
    m = segment.shape[0]
    real_suffix = suffix_mask.bool()[:, None, :]  # [M, 1, S]
    suffix_rows = torch.cat(
        [
            real_suffix & torch.ones(s, s, dtype=torch.bool, device=device).tril(),
            torch.zeros(m, s, length, dtype=torch.bool, device=device),
        ],
        dim=-1,
    )
    same = (segment[:, :, None] == segment[:, None, :]) & (segment[:, :, None] >= 0)
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    cont_rows = torch.cat([real_suffix.expand(-1, length, -1), same & causal], dim=-1)
    rows = torch.cat([suffix_rows, cont_rows], dim=1)  # [M, S + L, S + L]
    allowed = torch.cat([trunk_mask.bool()[:, None, :].expand(-1, s + length, -1), rows], dim=-1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def naive_scorer(model: torch.nn.Module, batch_size: int = 32) -> ScoreFn:
    """A ``score_fn`` that forwards every ``prefix + continuation`` from scratch, ``batch_size``
    pairs at a time (right-padded), with the LM head applied only where a continuation token is
    predicted."""
    decoder, lm_head = model.get_decoder(), model.get_output_embeddings()

    @torch.inference_mode()
    def score(
        prefixes: list[list[int]],
        continuations: list[list[int]],
        last_alternatives: Alternatives | None = None,
        generated: Sequence[Generated | None] | None = None,
    ) -> list[list[float]]:
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
                if last_alternatives is not None and last_alternatives[i] is not None:
                    _sum_last_alternatives(out, logp, {i: n_cont - 1}, last_alternatives)
        return out

    return _in_eval_mode(model, score)


def _left_padded(
    seqs: Sequence[Sequence[int]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids [N, W] left-padded with 0, and the mask of real tokens."""
    width = max(len(s) for s in seqs)
    ids = torch.tensor([[0] * (width - len(s)) + list(s) for s in seqs], device=device)
    lengths = torch.tensor([len(s) for s in seqs], device=device)
    mask = (torch.arange(width, device=device) >= width - lengths[:, None]).long()
    return ids.view(len(seqs), width), mask


def _right_padded(seqs: list[list[int]], device: torch.device) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    return torch.tensor([s + [0] * (width - len(s)) for s in seqs], device=device)


def _budget_chunks(
    items: list[int], width: dict[int, int], rows: int, tokens: int
) -> list[list[int]]:
    """Consecutive chunks of ``items`` (sorted by width) of at most ``rows`` items each, and of
    at most ``tokens`` padded tokens (items x widest width) unless one item alone is wider."""
    chunks: list[list[int]] = []
    for item in items:
        if chunks and len(chunks[-1]) < rows and (len(chunks[-1]) + 1) * width[item] <= tokens:
            chunks[-1].append(item)
        else:
            chunks.append([item])
    return chunks


def _chunks(items: list[T], size: int) -> list[list[T]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
