"""Policy-gradient pieces shared by the three methods: token log-probabilities and entropy,
the clipped policy loss and its aggregations, KL estimators, group advantages.

Pure functions on tensors; they know nothing of rubrics, teachers or rewards. Shapes: B
sequences, T positions, V vocabulary, H hidden size, N samples. A `mask` is 1 (or True) on the
tokens that count (the policy's own sampled tokens) and 0 elsewhere.
"""

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

AGGREGATIONS = (
    "seq_mean_token_mean",
    "token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
)


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ x·m over `dim` (all elements when None); positions with m = 0 never contribute."""
    masked = torch.where(mask.bool(), x, torch.zeros_like(x))
    return masked.sum() if dim is None else masked.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ x·m / Σ m over `dim`; an empty mask gives 0, not NaN."""
    count = mask.to(x.dtype).sum() if dim is None else mask.to(x.dtype).sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


# --- token log-probabilities and entropy, chunked so no [B, T, V] float32 tensor exists -------


def _chunked(
    fn: Callable[..., tuple[Tensor, ...]], chunk_size: int, rows: tuple, shared: tuple
) -> list[Tensor]:
    """Apply `fn(*row_chunks, *shared)` to chunks of `chunk_size` rows and concatenate.

    Each chunk is checkpointed: backward recomputes its [chunk, V] logits instead of keeping
    them, so peak memory is one chunk's logits in the forward and in the backward pass.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    outs = [
        checkpoint(fn, *chunk, *shared, use_reentrant=False)
        for chunk in zip(*(r.split(chunk_size) for r in rows), strict=True)
    ]
    return [torch.cat(parts) for parts in zip(*outs, strict=True)]


def _logp(logits: Tensor, labels: Tensor) -> Tensor:
    logits = logits.float()  # [n, V]
    return logits.gather(-1, labels[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)  # [n]


def _entropy(logits: Tensor) -> Tensor:
    logits = logits.float()  # [n, V]
    return torch.logsumexp(logits, -1) - (torch.softmax(logits, -1) * logits).sum(-1)  # [n]


def _entropy_detached(logits: Tensor) -> Tensor:
    """``_entropy`` without gradient, one [n, V] float32 temporary (softmax, times z in place)."""
    with torch.no_grad():
        z = logits.float()  # [n, V]
        p = torch.softmax(z, -1)  # [n, V]
        return torch.logsumexp(z, -1) - p.mul_(z).sum(-1)  # [n]


def logprobs_from_logits(logits: Tensor, labels: Tensor, chunk_size: int = 4096) -> Tensor:
    """log π(y) = z_y − logsumexp(z), per position, in float32.

    logits [..., V], labels [...] -> [...]. Rows are processed `chunk_size` at a time.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match labels {tuple(labels.shape)}")
    rows = (logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))  # [n, V], [n]
    (logp,) = _chunked(lambda z, y: (_logp(z, y),), chunk_size, rows, ())
    return logp.view(labels.shape)


def forward_logprobs(
    forward: Callable[..., Any],
    input_ids: Tensor,
    attention_mask: Tensor | None,
    chunk_size: int = 1024,
    temperature: float = 1.0,
    model: nn.Module | None = None,
    entropy: list[Tensor] | None = None,
) -> Tensor:
    """log π(x_{t+1} | x_≤t) through a full model forward, e.g. a TrainEngine's training forward.

    input_ids, attention_mask [B, T] -> [B, T-1]. No [B, T, V] tensor exists, forward or
    backward: during the call the model's output embedding (`model.get_output_embeddings()`,
    `model` defaulting to `forward` itself when it is a module, else `forward.model`) returns
    the log-probabilities of the next tokens, projecting its input `chunk_size` positions at a
    time (`head_returns_logprobs`). The projection stays inside the head module's own call, so
    DeepSpeed's hooks on it run: under ZeRO-3 they gather its weight for the forward and again
    for the backward, and reduce its gradient into the partition (tied embeddings included).
    Under DeepSpeed the training forward must be the engine's, which is why this takes a
    callable rather than reaching into the model like `sequence_logprobs`. ``entropy`` (a list):
    the entropy of each position's distribution [B, T-1] is appended to it, without gradient,
    from the same chunks (`head_returns_logprobs`).
    """
    if model is None:
        model = forward if isinstance(forward, nn.Module) else forward.model
    labels = torch.cat([input_ids[:, 1:], input_ids[:, :1]], dim=1)  # [B, T]; the last is unused
    sink: list[Tensor] | None = [] if entropy is not None else None
    with head_returns_logprobs(model, labels, chunk_size, temperature, entropy=sink):
        logp = forward(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    if logp.shape != labels.shape:
        raise ValueError(f"the model returned {tuple(logp.shape)} for labels {tuple(labels.shape)}")
    if entropy is not None and sink:
        entropy.append(sink[-1][:, :-1])  # [B, T-1]
    return logp[:, :-1]  # [B, T-1]: position t predicts token t+1


def shared_prompt_logprobs(
    forward: Callable[..., Any],
    prompt_ids: Tensor,
    response_ids: Tensor,
    response_mask: Tensor,
    chunk_size: int = 1024,
    temperature: float = 1.0,
    model: nn.Module | None = None,
    entropy: list[Tensor] | None = None,
) -> Tensor:
    """log π(response tokens | prompt) for b responses to one prompt, the prompt forwarded once.

    prompt_ids [P] (P >= 2), response_ids and response_mask [b, R] (right-padded; 1 on real
    tokens) -> [b, R]: the values `forward_logprobs` gives those positions of the b
    concatenations, up to float rounding, and the same gradients. The prompt but its last token
    runs once and returns its key/value cache; repeated b times, the cache holds the prompt for
    the continuations [last prompt token, response[:-1]], whose outputs predict the responses.
    The gradient reaches the prompt's forward through the cache. A GRPO group's G responses
    share their prompt: with a 280-token prompt and 32-token answers the update forwards about
    a fifth of the tokens. The model must return its cache while training: not under
    gradient checkpointing (HF then turns the cache off). ``entropy`` (a list): each response
    position's entropy [b, R] is appended to it, without gradient.
    """
    if prompt_ids.dim() != 1 or len(prompt_ids) < 2:
        raise ValueError(f"prompt_ids must be [P] with P >= 2, got {tuple(prompt_ids.shape)}")
    if response_ids.dim() != 2 or response_ids.shape != response_mask.shape:
        raise ValueError(
            f"response_ids {tuple(response_ids.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must be the same [b, R]"
        )
    b = response_ids.shape[0]
    head = forward(input_ids=prompt_ids[None, :-1], use_cache=True, logits_to_keep=1)
    cache = head.past_key_values
    if cache is None:
        raise RuntimeError(
            "shared_prompt_logprobs: the model returned no cache in training mode "
            "(gradient checkpointing on?); set loss.share_prompt=false"
        )
    cache.batch_repeat_interleave(b)
    last = prompt_ids[-1:].expand(b, 1)
    inputs = torch.cat([last, response_ids[:, :-1]], dim=1)  # [b, R]
    seen = torch.ones(b, len(prompt_ids), dtype=response_mask.dtype, device=response_mask.device)
    attention = torch.cat([seen, response_mask[:, :-1]], dim=1)  # [b, P - 1 + R]
    if model is None:
        model = forward if isinstance(forward, nn.Module) else forward.model
    with head_returns_logprobs(model, response_ids, chunk_size, temperature, entropy=entropy):
        logp = forward(
            input_ids=inputs, attention_mask=attention, past_key_values=cache, use_cache=True
        ).logits
    if logp.shape != response_ids.shape:
        raise ValueError(
            f"the model returned {tuple(logp.shape)} for responses {tuple(response_ids.shape)}"
        )
    return logp


@contextmanager
def head_returns_logprobs(
    model: nn.Module,
    labels: Tensor,
    chunk_size: int = 1024,
    temperature: float = 1.0,
    entropy: list[Tensor] | None = None,
) -> Iterator[None]:
    """While active, the model's output embedding maps hidden states [B, T, H] to log π(labels)
    [B, T] (float32) instead of logits [B, T, V], by `logprobs_from_hidden`: `chunk_size`
    positions' logits at a time, recomputed in the backward.

    The head's `forward` is replaced for the duration, its `__call__` (and so any hooks on the
    module, e.g. DeepSpeed's) untouched. The head must be a plain `nn.Linear` applied to every
    position (HF's default `logits_to_keep=0`) with nothing done to the logits after it; models
    that soft-cap or scale their logits are refused. ``entropy`` (a list): each head call
    appends the entropy of every position's distribution [B, T] (float32, no gradient),
    computed from the same chunk's logits (``logprobs_from_hidden(with_entropy="detached")``).
    """
    head = model.get_output_embeddings()
    if type(head) is not nn.Linear:
        raise ValueError(
            f"head_returns_logprobs: the output embedding is {type(head).__name__}, "
            "not a plain nn.Linear (a LoRA adapter on the head?)"
        )
    config = getattr(model, "config", None)
    for attr in ("final_logit_softcapping", "logit_scale", "output_multiplier_scale"):
        if getattr(config, attr, None) not in (None, 1, 1.0):
            raise ValueError(
                f"head_returns_logprobs: the model's config sets {attr}, which "
                "changes its logits after the head"
            )

    def forward(hidden: Tensor) -> Tensor:
        if hidden.shape[:-1] != labels.shape:
            raise ValueError(
                f"head_returns_logprobs: the head got hidden states "
                f"{tuple(hidden.shape)} for labels {tuple(labels.shape)}"
            )
        logp, h = logprobs_from_hidden(
            hidden,
            head.weight,
            labels,
            chunk_size,
            temperature,
            lm_head_bias=head.bias,
            with_entropy="detached" if entropy is not None else False,
        )
        if entropy is not None and h is not None:
            entropy.append(h)
        return logp

    previous = head.__dict__.get("forward")
    head.forward = forward
    try:
        yield
    finally:
        if previous is None:
            del head.forward
        else:
            head.forward = previous


def entropy_from_logits(logits: Tensor, chunk_size: int = 4096, detached: bool = False) -> Tensor:
    """H = logsumexp(z) − Σ_v softmax(z)_v z_v, per position, in float32.

    logits [..., V] -> [...]. Rows are processed `chunk_size` at a time. ``detached``: without
    gradient (a metric), one [chunk_size, V] float32 temporary at a time.
    """
    if detached:
        flat = logits.reshape(-1, logits.shape[-1])  # [n, V]
        if flat.shape[0] == 0:
            return flat.new_zeros(logits.shape[:-1], dtype=torch.float32)
        parts = [_entropy_detached(z) for z in flat.detach().split(chunk_size)]
        return torch.cat(parts).view(logits.shape[:-1])
    rows = (logits.reshape(-1, logits.shape[-1]),)  # [n, V]
    (entropy,) = _chunked(lambda z: (_entropy(z),), chunk_size, rows, ())
    return entropy.view(logits.shape[:-1])


def logprobs_from_hidden(
    hidden: Tensor,
    lm_head_weight: Tensor,
    labels: Tensor,
    chunk_size: int = 4096,
    temperature: float = 1.0,
    lm_head_bias: Tensor | None = None,
    with_entropy: bool | str = False,
) -> tuple[Tensor, Tensor | None]:
    """Token log-probabilities (and entropy) of `labels` straight from the final hidden states.

    z = (h Wᵀ + b) / τ,  log π(y) = z_y − logsumexp(z),  H = logsumexp(z) − Σ_v softmax(z)_v z_v.

    hidden [..., H], lm_head_weight [V, H], labels [...] -> (logp [...], entropy [...] or None).
    The logits of only `chunk_size` positions exist at a time, forward and backward. τ is the
    sampling temperature, so that logp matches the logprobs the rollout engine reported.
    ``with_entropy="detached"``: the entropy without gradient, for a metric (no graph through
    it, one [chunk, V] float32 temporary beside the chunk's logits).
    """
    if hidden.shape[:-1] != labels.shape:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} does not match labels {tuple(labels.shape)}"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")

    if with_entropy not in (False, True, "detached"):
        raise ValueError(f"with_entropy must be a bool or 'detached', got {with_entropy!r}")

    def chunk(h: Tensor, y: Tensor, w: Tensor, b: Tensor | None) -> tuple[Tensor, ...]:
        logits = F.linear(h, w, b) / temperature  # [n, V]
        if with_entropy == "detached":  # one float32 copy for both: the plan's logit bytes
            z = logits.float()  # [n, V]
            return _logp(z, y), _entropy_detached(z)
        return (_logp(logits, y), _entropy(logits)) if with_entropy else (_logp(logits, y),)

    flat_hidden, flat_labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
    outs = _chunked(chunk, chunk_size, (flat_hidden, flat_labels), (lm_head_weight, lm_head_bias))
    logp = outs[0].view(labels.shape)
    return logp, outs[1].view(labels.shape) if with_entropy else None


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    chunk_size: int = 4096,
    temperature: float = 1.0,
    with_entropy: bool = False,
    position_ids: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """log π(x_{t+1} | x_≤t) of every next token of a HF causal LM, without its full logits.

    input_ids, attention_mask [B, T] -> (logp [B, T-1], entropy [B, T-1] or None).
    Runs the decoder (`model.get_decoder()`, else `model.model`) and projects its hidden states
    with `model.get_output_embeddings()` chunk by chunk; this holds for tied embeddings and for
    peft LoRA models, whose adapters live inside the decoder's modules. `position_ids` is
    passed through for packed batches.
    """
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    head = model.get_output_embeddings()
    hidden = decoder(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
    ).last_hidden_state  # [B, T, H]
    return logprobs_from_hidden(
        hidden[:, :-1],  # [B, T-1, H]: position t predicts token t+1
        head.weight,
        input_ids[:, 1:],  # [B, T-1]
        chunk_size=chunk_size,
        temperature=temperature,
        lm_head_bias=head.bias,
        with_entropy=with_entropy,
    )


# --- policy loss ---------------------------------------------------------------------------


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clipped surrogate per token, with asymmetric clip range (DAPO) and optional dual clip.

    r = exp(logp − old_logp),  L = −min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A);
    dual clip (Ye et al., 2020), only where A < 0: L = min(L, −c·A), c > 1.

    logp, old_logp, advantages, mask [B, T] -> (loss [B, T], 0 where mask = 0; stats).
    Stats (no gradient, over masked tokens): clip_frac (the clip binds and stops the gradient),
    clip_frac_low / clip_frac_high (r below / above the range with the clip binding),
    dual_clip_frac (when c is set), ratio_mean, ratio_min, ratio_max (±inf for an empty mask).
    """
    if not logp.shape == old_logp.shape == advantages.shape == mask.shape:
        raise ValueError(
            "logp, old_logp, advantages and mask must share one shape, got "
            f"{tuple(logp.shape)}, {tuple(old_logp.shape)}, {tuple(advantages.shape)}, "
            f"{tuple(mask.shape)} (use broadcast_to_tokens for per-sequence advantages)"
        )
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    keep = mask.bool()
    # r = 1 off the mask, so padding's arbitrary logprobs can neither overflow nor get gradient.
    log_ratio = torch.where(keep, logp - old_logp, torch.zeros_like(logp))  # [B, T]
    ratio = log_ratio.exp()  # [B, T]
    unclipped = -ratio * advantages  # [B, T]
    clipped = -ratio.clamp(1 - eps_low, 1 + eps_high) * advantages  # [B, T]
    loss = torch.maximum(unclipped, clipped)  # [B, T]
    binds = clipped > unclipped  # [B, T]
    stats = {
        "clip_frac": masked_mean(binds.float(), keep),
        "clip_frac_low": masked_mean((binds & (ratio < 1)).float(), keep),
        "clip_frac_high": masked_mean((binds & (ratio > 1)).float(), keep),
    }
    if dual_clip is not None:
        cap = -dual_clip * advantages  # [B, T]
        dual = (advantages < 0) & (loss > cap)  # [B, T]
        loss = torch.where(dual, cap, loss)
        stats["dual_clip_frac"] = masked_mean(dual.float(), keep)
    r = ratio.detach()
    stats |= {
        "ratio_mean": masked_mean(r, keep),
        "ratio_min": torch.where(keep, r, torch.inf).min(),
        "ratio_max": torch.where(keep, r, -torch.inf).max(),
    }
    return torch.where(keep, loss, torch.zeros_like(loss)), stats


def aggregate_loss(
    per_token: Tensor,
    mask: Tensor,
    mode: str,
    constant: float | None = None,
    num_seqs: int | None = None,
    num_tokens: float | None = None,
) -> Tensor:
    """Reduce a per-token loss [B, T] to a scalar. With m the mask and l the loss:

    seq_mean_token_mean      (GRPO):    1/B · Σ_b (Σ_t m·l / Σ_t m)
    token_mean               (DAPO):    Σ_bt m·l / Σ_bt m
    seq_mean_token_sum       (CER):     1/B · Σ_b Σ_t m·l
    seq_mean_token_sum_norm  (Dr.GRPO): Σ_bt m·l / (B · constant), constant = max response length

    A sequence without masked tokens contributes 0 and still counts in B. ``num_seqs`` (B) and
    ``num_tokens`` (Σ_bt m), when given, are those of the batch these rows were taken from: rows
    whose loss is 0 left out of the forward leave the value and its gradient as they were.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {mode!r}; expected one of {AGGREGATIONS}")
    if (constant is not None) != (mode == "seq_mean_token_sum_norm"):
        raise ValueError(f"constant is required by seq_mean_token_sum_norm only (mode {mode!r})")
    if constant is not None and constant <= 0:
        raise ValueError(f"constant must be > 0, got {constant}")
    if per_token.shape != mask.shape or per_token.dim() != 2:
        raise ValueError(
            f"loss {tuple(per_token.shape)} and mask {tuple(mask.shape)} must be [B, T]"
        )
    rows = per_token.shape[0] if num_seqs is None else num_seqs
    if rows < per_token.shape[0]:
        raise ValueError(f"num_seqs {rows} is less than the {per_token.shape[0]} rows given")
    if mode == "seq_mean_token_mean":
        return masked_mean(per_token, mask, dim=1).sum() / rows
    if mode == "token_mean":
        if num_tokens is None:
            return masked_mean(per_token, mask)
        return masked_sum(per_token, mask) / max(num_tokens, 1.0)
    if mode == "seq_mean_token_sum":
        return masked_sum(per_token, mask) / rows
    return masked_sum(per_token, mask) / (rows * constant)


# --- KL estimators (Schulman, "Approximating KL divergence", 2020) ---------------------------


def kl_k1(logp: Tensor, ref_logp: Tensor, mask: Tensor | None = None) -> Tensor:
    """k1 = log π(y) − log π_ref(y), y ~ π: unbiased for KL(π ‖ π_ref), high variance, can be < 0.

    logp, ref_logp [B, T] -> [B, T], 0 where mask = 0.
    """
    log_ratio = logp - ref_logp
    return log_ratio if mask is None else torch.where(mask.bool(), log_ratio, 0.0)


def kl_k3(logp: Tensor, ref_logp: Tensor, mask: Tensor | None = None) -> Tensor:
    """k3 = exp(δ) − δ − 1 with δ = log π_ref(y) − log π(y), y ~ π: unbiased for KL(π ‖ π_ref), ≥ 0.

    logp, ref_logp [B, T] -> [B, T], 0 where mask = 0.
    """
    delta = ref_logp - logp
    if mask is not None:
        delta = torch.where(mask.bool(), delta, 0.0)  # off the mask δ = 0, so k3 = 0
    return delta.exp() - delta - 1


# --- advantages ----------------------------------------------------------------------------


def _groups(rewards: Tensor, group_ids: Sequence | Tensor) -> tuple[Tensor, Tensor, int]:
    """Check rewards [N] and map group ids (ints or strings) to 0..G-1 in order of first
    appearance: (float rewards [N], group index [N], G)."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    ids = group_ids.tolist() if isinstance(group_ids, Tensor) else list(group_ids)
    if len(ids) != rewards.numel():
        raise ValueError(f"{len(ids)} group ids for {rewards.numel()} rewards")
    first: dict = {}
    index = [first.setdefault(g, len(first)) for g in ids]
    rewards = rewards if rewards.is_floating_point() else rewards.float()
    return rewards, torch.tensor(index, dtype=torch.long, device=rewards.device), len(first)


def _group_sums(x: Tensor, index: Tensor, num_groups: int) -> Tensor:
    """Σ_{j in group(i)} x_j for each i: [N] -> [N]."""
    return x.new_zeros(num_groups).index_add_(0, index, x)[index]


def group_normalized_advantages(
    rewards: Tensor,
    group_ids: Sequence | Tensor,
    eps: float = 1e-6,
    ddof: int = 1,
    scale_by_std: bool = True,
) -> Tensor:
    """GRPO's advantage: A_i = (r_i − mean_g) / (std_g + ε) over the group g of sample i.

    rewards [N], group_ids N ints or strings -> [N]. std_g = sqrt(Σ_g (r − mean_g)² / (n_g − ddof));
    ddof = 1 (unbiased, torch.std's default) is EviBack's setting. `scale_by_std=False` gives
    r_i − mean_g (Dr.GRPO). A one-member group, or one of equal rewards, has advantage 0.
    """
    if ddof < 0:
        raise ValueError(f"ddof must be >= 0, got {ddof}")
    rewards, index, num_groups = _groups(rewards, group_ids)
    count = _group_sums(torch.ones_like(rewards), index, num_groups)  # [N]
    centred = rewards - _group_sums(rewards, index, num_groups) / count  # [N]
    if not scale_by_std:
        return centred
    std = (_group_sums(centred**2, index, num_groups) / (count - ddof).clamp(min=1)).sqrt()  # [N]
    # Equal rewards give 0 even with eps = 0, instead of 0/0.
    return torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))


def rloo_advantages(rewards: Tensor, group_ids: Sequence | Tensor) -> Tensor:
    """Leave-one-out baseline (RLOO): A_i = r_i − 1/(n_g − 1) · Σ_{j in g, j ≠ i} r_j.

    rewards [N], group_ids N ints or strings -> [N]. A one-member group has no other sample to
    compare with: advantage 0. Advantages sum to 0 within each group.
    """
    rewards, index, num_groups = _groups(rewards, group_ids)
    count = _group_sums(torch.ones_like(rewards), index, num_groups)  # [N]
    others = _group_sums(rewards, index, num_groups) - rewards  # [N]
    advantages = rewards - others / (count - 1).clamp(min=1)  # [N]
    return torch.where(count > 1, advantages, torch.zeros_like(advantages))


def broadcast_to_tokens(advantages: Tensor, mask: Tensor) -> Tensor:
    """A_bt = A_b · m_bt: one advantage per sequence onto its tokens. [B], [B, T] -> [B, T]."""
    if advantages.dim() != 1 or mask.dim() != 2 or advantages.shape[0] != mask.shape[0]:
        raise ValueError(
            f"advantages {tuple(advantages.shape)} must be [B] for mask [B, T] {tuple(mask.shape)}"
        )
    return advantages[:, None] * mask.to(advantages.dtype)
