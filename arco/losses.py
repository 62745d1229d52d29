"""ARCO's losses on tensors: the rubric model's decomposition loss and class weights, the exact
token KL (at the positions that count, in chunks), the policy's per-step loss and the rubric
model's warmup SFT loss (arco/README.md, "The method").

Each returns per-row values (or a scalar where said); reductions over the batch are the
trainer's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

KL_DIRECTIONS = ("forward", "reverse")


def class_weights(outcomes: torch.Tensor) -> torch.Tensor:
    """w_tau = n / (2 max(n_pos, 1)) where R > 0.5, else n / (2 max(n_neg, 1)).

    n = B, n_pos = #(R > 0.5), n_neg = B - n_pos: each class carries half of the batch's
    weight. Shapes: outcomes [B] -> weights [B] (float).
    """
    dtype = outcomes.dtype if outcomes.is_floating_point() else torch.float32
    pos = outcomes > 0.5  # [B]
    n = outcomes.shape[0]
    n_pos = int(pos.sum())
    w_pos = n / (2 * max(n_pos, 1))
    w_neg = n / (2 * max(n - n_pos, 1))
    return torch.where(pos, w_pos, w_neg).to(dtype=dtype)


def decomposition_loss(
    step_scores: torch.Tensor,
    step_mask: torch.Tensor,
    outcomes: torch.Tensor,
    weights: torch.Tensor,
) -> torch.Tensor:
    """Per trajectory: w_tau * (sum_t s_t - R(tau))^2, the sum over real steps only.

    Shapes: step_scores [B, S] (s_t, padded), step_mask [B, S] (1 for real steps), outcomes [B],
    weights [B] -> [B].
    """
    total = torch.where(step_mask.bool(), step_scores, 0.0).sum(dim=-1)  # [B]
    return weights * (total - outcomes) ** 2


def _kl_rows(logits: torch.Tensor, ref_logits: torch.Tensor, reverse: bool) -> torch.Tensor:
    """KL per row of [n, V] x2 -> [n], in float32 (one chunk of ``token_kl``)."""
    logp = F.log_softmax(logits.float(), dim=-1)  # [n, V]
    logq = F.log_softmax(ref_logits.float(), dim=-1)  # [n, V]
    if reverse:
        logp, logq = logq, logp
    return (logp.exp() * (logp - logq)).sum(dim=-1)  # [n]


def token_kl(
    logits: torch.Tensor,
    ref_logits: torch.Tensor,
    direction: str = "forward",
    chunk_size: int = 1024,
) -> torch.Tensor:
    """Exact KL over the vocabulary at each position, in float32.

        forward (the paper's):    KL(pi || pi_ref) = sum_v p log(p / q)
        reverse (the release's):  KL(pi_ref || pi) = sum_v q log(q / p)

    with p = softmax(logits), q = softmax(ref_logits). Shapes: [..., V] x2 -> [...]; give it the
    positions that count only (``masked_token_kl``, or the model's logits at those positions).
    Positions go ``chunk_size`` at a time, each chunk checkpointed: the float32 log-softmaxes
    exist for one [chunk_size, V] chunk at a time, in the forward and in the backward.
    """
    if direction not in KL_DIRECTIONS:
        raise ValueError(f"token_kl: direction must be one of {KL_DIRECTIONS}; got {direction!r}")
    if chunk_size < 1:
        raise ValueError(f"token_kl: chunk_size must be >= 1, got {chunk_size}")
    if logits.shape != ref_logits.shape:
        raise ValueError(f"token_kl: {tuple(logits.shape)} vs {tuple(ref_logits.shape)}")
    v = logits.shape[-1]
    rows, ref_rows = logits.reshape(-1, v), ref_logits.reshape(-1, v)  # [n, V]
    reverse = direction == "reverse"
    parts = [
        checkpoint(_kl_rows, z, q, reverse, use_reentrant=False)
        if torch.is_grad_enabled() and (z.requires_grad or q.requires_grad)
        else _kl_rows(z, q, reverse)
        for z, q in zip(rows.split(chunk_size), ref_rows.split(chunk_size), strict=True)
    ]
    out = torch.cat(parts) if parts else rows.new_zeros(0, dtype=torch.float32)
    return out.view(logits.shape[:-1])


def scatter_positions(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Values at the positions of ``mask`` (row-major, as ``x[mask]`` lists them) placed back in
    ``mask``'s shape, 0 elsewhere; differentiable in ``values``. Shapes: [n], [N, T] -> [N, T]."""
    where = mask.bool().nonzero(as_tuple=True)
    out = torch.zeros(mask.shape, dtype=values.dtype, device=values.device)
    return out.index_put(where, values)


def masked_token_kl(
    logits: torch.Tensor,
    ref_logits: torch.Tensor,
    mask: torch.Tensor,
    direction: str = "forward",
    chunk_size: int = 1024,
) -> torch.Tensor:
    """``token_kl`` at the positions where ``mask`` is 1 only, 0 elsewhere (the positions are
    selected before any log-softmax). Shapes: [N, T, V] x2, mask [N, T] -> [N, T]."""
    m = mask.bool()
    return scatter_positions(token_kl(logits[m], ref_logits[m], direction, chunk_size), m)


def masked_token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """mean_t values[n, t] over positions with mask[n, t] = 1; 0 for a row without any.

    Shapes: values [N, T], mask [N, T] -> [N].
    """
    m = mask.bool()  # [N, T]
    total = torch.where(m, values, 0.0).sum(dim=-1)  # [N]
    return total / m.sum(dim=-1).clamp(min=1)


def policy_step_loss(
    logp: torch.Tensor, token_advantages: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """-sum_t A_t log pi(token_t) over masked tokens, per row; the gradient flows through logp only.

    A_t is the step's advantage broadcast to that step's tokens. Shapes: logp [B, T],
    token_advantages [B, T], mask [B, T] -> [B].
    """
    weighted = token_advantages.detach() * logp  # [B, T]
    return -torch.where(mask.bool(), weighted, 0.0).sum(dim=-1)


def rubric_sft_loss(
    token_logp: torch.Tensor,
    token_mask: torch.Tensor,
    pred_scores: torch.Tensor,
    target_scores: torch.Tensor,
    score_weight: float = 10.0,
    n_tokens: int | None = None,
    n_scores: int | None = None,
) -> torch.Tensor:
    """Warmup loss of the rubric model, a scalar:

        L = -(1 / #mask) sum_{b,t masked} log mu(token_{b,t}) + score_weight * mean (d - d*)^2

    the cross-entropy a token mean over all masked tokens of the batch (criteria JSON + EOS),
    the MSE a mean over all B*K scores. Shapes: token_logp [B, T], token_mask [B, T],
    pred_scores [B, K], target_scores [B, K] -> [].

    ``n_tokens`` and ``n_scores``: the whole batch's masked tokens and scores when these rows are
    one micro-batch of it (default: these rows'), so the micro-batches' losses sum to the batch's.
    """
    m = token_mask.bool()  # [B, T]
    tokens = int(m.sum()) if n_tokens is None else n_tokens
    scores = pred_scores.numel() if n_scores is None else n_scores
    ce = -torch.where(m, token_logp, 0.0).sum() / max(tokens, 1)
    sq = (pred_scores.float() - target_scores.float()) ** 2
    return ce + score_weight * sq.sum() / max(scores, 1)
