"""A rehearsal's stand-in model: the real architecture class (``Qwen3ForCausalLM`` or
``LlamaForCausalLM``) with the real tokenizer, vocabulary, embedding tie and rope settings, but 2
layers, width 64 (more for long scripts) and random weights, optionally scripted to sample a given
token-level Markov chain.

The script (a chain: token -> {successor: probability}, plus a ``default`` successor for every
other token) is written into the weights of an ordinary checkpoint, so HF and vLLM run it through
their own code paths. With hidden size H, basis vectors e_0 .. e_{H-1}:

- Every scripted token (chain tokens, their successors and ``default``) gets its own basis
  embedding e_d; every other token shares e_0; e_1 (the "sink") no token embeds on. Input and
  output embeddings are the same matrix, so tied models stay tied (an untied real model, Qwen3-8B,
  gets an ``lm_head`` equal to the embedding at the start).
- Layer 0's MLP has one unit per input direction (gate and up rows along e_d, which fire only for
  that direction) whose ``down_proj`` column replaces the token's direction by its target
  residual r(x) = K (sum_s l_s e_s - N e_0 + rest e_1) / Lambda, with l_s = MARGIN + log p(s|x).
- The final RMSNorm's weight is set so that the output embedding turns r(x) into the logits l_s
  at the successors, -N (``UNSCRIPTED_LOGIT``) at every unscripted token and 0 at the scripted
  tokens that do not follow x: sampling at temperature 1 follows the chain, and what leaks to
  the other ~150k tokens is below 1e-5 (1e-4 at 0.7-1.0 and in bf16).
- Every other weight is the architecture's random initialisation, except the attention output
  projections, layer 1's MLP output and layer 0's unused MLP units' outputs: small random
  (std ``SMALL_STD``), not zero, so LoRA on q/k/v/o and the MLP gets real, non-zero gradients,
  while their perturbation of the script stays near 1e-3 in the logits.

bf16 rounds the logits near 18 to about 0.06, so in bf16 the branch probabilities hold to a few
per cent (exact in float32). Sampling defaults of the real generation_config (temperature, top_p,
top_k) are not copied: only its bos/eos/pad ids.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from transformers import (
    GenerationConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen3ForCausalLM,
)

from experiments.rehearse.tokenizers import model_facts, standin_config, standin_tokenizer

Chain = dict[int, dict[int, float]]

MARGIN = 18.0  # logit of a successor with p = 1
UNSCRIPTED_LOGIT = -8.0  # logit of every token the script never names
SMALL_STD = 1e-3  # the random output projections that keep gradients non-zero
RESIDUAL_NORM = 16.0  # |r(x)|, large against the attention's perturbation
EMBED_SCALE = 1.0


def chain_from_paths(paths: Sequence[tuple[Sequence[int], float]]) -> Chain:
    """The Markov chain that walks the weighted token paths: each step a -> b of a path adds its
    weight to that transition, and each token's successors get probabilities proportional to the
    weights. Paths sharing a prefix branch where they part (probabilities are then the paths'
    weights); a token revisited, in one path or several, merges its successors (loops are allowed:
    the caller bounds the generation length).

    The chain is first-order: what follows a token depends on that token only, so a token that a
    script uses twice (``answer`` and ``>`` in ``<answer> x </answer>``) gets the union of its
    successors; script such text with tokens that do not repeat, or accept the branching."""
    weights: dict[int, dict[int, float]] = {}
    for i, item in enumerate(paths):
        try:
            path, weight = item
        except (TypeError, ValueError) as e:
            raise ValueError(f"path {i}: expected (token ids, weight), got {item!r}") from e
        weight = float(weight)
        if not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"path {i}: weight must be positive and finite, got {weight}")
        ids = list(path)
        if len(ids) < 2:
            raise ValueError(f"path {i}: needs at least 2 tokens (one step), got {ids}")
        for tok in ids:
            if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
                raise ValueError(f"path {i}: token ids must be non-negative ints, got {tok!r}")
        for cur, nxt in zip(ids, ids[1:], strict=False):
            row = weights.setdefault(cur, {})
            row[nxt] = row.get(nxt, 0.0) + weight
    return {
        cur: {nxt: w / sum(row.values()) for nxt, w in row.items()} for cur, row in weights.items()
    }


def check_chain(chain: Mapping[int, Mapping[int, float]], vocab_size: int) -> None:
    """Each row a probability distribution over ids below `vocab_size`; errors name the token."""
    for cur, row in chain.items():
        if not row:
            raise ValueError(f"chain: token {cur} has no successors")
        for tok in (cur, *row):
            if not 0 <= int(tok) < vocab_size:
                raise ValueError(
                    f"chain: token {tok} is outside the vocabulary (0..{vocab_size - 1})"
                )
        if any(not p > 0 for p in row.values()) or abs(sum(row.values()) - 1) > 1e-6:
            raise ValueError(
                f"chain: successors of token {cur} must be positive and sum to 1: {row}"
            )


def successors(
    chain: Mapping[int, Mapping[int, float]], default: int, token: int
) -> dict[int, float]:
    """What the stand-in samples after `token`: its chain row, else ``{default: 1}``."""
    return dict(chain.get(token, {default: 1.0}))


def _model_class(architecture: str) -> type[PreTrainedModel]:
    return {"Qwen3ForCausalLM": Qwen3ForCausalLM, "LlamaForCausalLM": LlamaForCausalLM}[
        architecture
    ]


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@torch.no_grad()
def _write_script(model: PreTrainedModel, chain: Chain, default: int, seed: int) -> dict:
    """Write the chain into `model`'s weights (see the module docstring); returns its sizes."""
    cfg = model.config
    hidden, vocab = cfg.hidden_size, cfg.vocab_size
    scripted = sorted(set(chain) | {s for row in chain.values() for s in row} | {default})
    direction = {tok: 2 + i for i, tok in enumerate(scripted)}  # e_0 unscripted, e_1 the sink
    gen = torch.Generator().manual_seed(seed + 1)

    def small(shape: torch.Size) -> torch.Tensor:
        return torch.randn(shape, generator=gen) * SMALL_STD

    # the target residual of each input direction: {direction: {coordinate: logit}}
    targets: dict[int, dict[int, float]] = {0: {direction[default]: MARGIN}}
    for tok in scripted:
        row = successors(chain, default, tok)
        targets[direction[tok]] = {direction[s]: MARGIN + math.log(p) for s, p in row.items()}
    need = max(
        math.sqrt(sum(v * v for v in t.values()) + UNSCRIPTED_LOGIT**2) for t in targets.values()
    )
    lam = 1.25 * need  # Lambda: the rest of each target's norm goes to the sink e_1
    eps = cfg.rms_norm_eps

    embed = model.get_input_embeddings().weight  # [V, H]
    embed.zero_()
    embed[:, 0] = EMBED_SCALE
    for tok, d in direction.items():
        embed[tok] = 0.0
        embed[tok, d] = EMBED_SCALE
    if not cfg.tie_word_embeddings:
        model.get_output_embeddings().weight.copy_(embed)
    # final norm: logit_s = EMBED_SCALE * w * r_s / sqrt(|r|^2 / H + eps) with r_s = K l_s / Lambda
    k = RESIDUAL_NORM
    model.model.norm.weight.fill_(lam * math.sqrt(k * k / hidden + eps) / (EMBED_SCALE * k))

    mlp = model.model.layers[0].mlp
    units = mlp.gate_proj.weight.shape[0]
    if units < len(targets):
        raise ValueError(f"{len(targets)} scripted directions need intermediate size >= that")
    mlp.down_proj.weight.copy_(small(mlp.down_proj.weight.shape))
    scale = EMBED_SCALE / math.sqrt(EMBED_SCALE**2 / hidden + eps)  # |normed input| on e_d
    act = torch.nn.functional.silu(torch.tensor(scale, dtype=torch.float64)).item() * scale
    for unit, (d, logits) in enumerate(sorted(targets.items())):
        mlp.gate_proj.weight[unit] = 0.0
        mlp.gate_proj.weight[unit, d] = 1.0
        mlp.up_proj.weight[unit] = 0.0
        mlp.up_proj.weight[unit, d] = 1.0
        target = torch.zeros(hidden, dtype=torch.float64)
        for coord, logit in logits.items():
            target[coord] = k * logit / lam
        target[0] = k * UNSCRIPTED_LOGIT / lam
        target[1] = math.sqrt(k * k - float(target.pow(2).sum()))
        target[d] -= EMBED_SCALE
        mlp.down_proj.weight[:, unit] = (target / act).to(mlp.down_proj.weight.dtype)
    for i, layer in enumerate(model.model.layers):
        layer.self_attn.o_proj.weight.copy_(small(layer.self_attn.o_proj.weight.shape))
        if i > 0:
            layer.mlp.down_proj.weight.copy_(small(layer.mlp.down_proj.weight.shape))
    if len(scripted) + 2 > hidden or vocab <= max(scripted):
        raise AssertionError("stand-in sizes were not checked")
    return {"scripted_tokens": len(scripted), "chain_rows": len(chain), "default": default}


def build_standin(
    model_id: str,
    out_dir: str | Path,
    chain: Mapping[int, Mapping[int, float]] | None = None,
    default: int | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    cache_dir: str | Path | None = None,
    use_hub: bool = True,
) -> Path:
    """Save `model_id`'s stand-in in `out_dir` (model, tokenizer, generation_config and
    ``standin.json``, loadable by transformers and vLLM) and return the folder.

    `chain` (token -> {successor: p}, e.g. from ``chain_from_paths``) and `default` (the successor
    of every other token; the tokenizer's eos when only `chain` is given) script the sampling;
    neither: plain random weights. `tokenizer`: a prebuilt one (else ``standin_tokenizer`` with
    `cache_dir`, default ``~/.cache/rehearse-tokenizers``, and `use_hub`)."""
    facts = model_facts(model_id)
    if tokenizer is None:
        cache = Path(cache_dir or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")))
        tokenizer = standin_tokenizer(model_id, cache / "rehearse-tokenizers", use_hub=use_hub)
    scripted = chain is not None or default is not None
    chain = {int(a): {int(b): float(p) for b, p in row.items()} for a, row in (chain or {}).items()}
    if scripted and default is None:
        default = tokenizer.eos_token_id
    check_chain(chain, facts.vocab_size)
    if default is not None and not 0 <= default < facts.vocab_size:
        raise ValueError(f"default successor {default} is outside the vocabulary")
    n_scripted = len(set(chain) | {s for row in chain.values() for s in row} | {default})
    hidden = max(64, _round_up(n_scripted + 2, 32)) if scripted else 64
    inter = max(128, _round_up(n_scripted + 1 + 32, 32)) if scripted else 128
    config = standin_config(model_id, hidden_size=hidden, intermediate_size=inter)
    config.dtype = torch.float32
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _model_class(facts.architecture)(config)
    model.float()
    sizes = _write_script(model, chain, default, seed) if scripted else {}
    model = model.to(dtype)
    model.config.dtype = dtype
    model.generation_config = GenerationConfig(
        bos_token_id=facts.bos_token_id,
        eos_token_id=facts.generation_eos,
        pad_token_id=facts.pad_token_id,
    )
    from common.tinyworld.model import save_model_folder

    out = save_model_folder(model, tokenizer, out_dir)
    record = {
        "stands_for": model_id,
        "architecture": facts.architecture,
        "num_hidden_layers": config.num_hidden_layers,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "vocab_size": facts.vocab_size,
        "tie_word_embeddings": config.tie_word_embeddings,
        "real_tie_word_embeddings": facts.tie_word_embeddings,
        "scripted": scripted,
        "chain_rows": len(chain),
        "scripted_tokens": sizes.get("scripted_tokens", 0),
        "default": default,
        "margin": MARGIN if scripted else None,
        "unscripted_logit": UNSCRIPTED_LOGIT if scripted else None,
        "seed": seed,
        "dtype": str(dtype).removeprefix("torch."),
        "tokenizer": type(tokenizer).__name__,
        "differs_from_real": [
            "2 layers, small width, 2 heads of 32 (1 kv head), random weights",
            "sampling defaults of generation_config not copied (only its special ids)",
        ]
        + (
            ["weights scripted to a token-level Markov chain (see experiments/rehearse/standin.py)"]
            if scripted
            else []
        ),
    }
    (out / "standin.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return out
