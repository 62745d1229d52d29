"""A real Qwen3 checkpoint whose greedy next token is a fixed function of the current token.

Test helper: its behaviour is scripted exactly, yet it is an ordinary ``Qwen3ForCausalLM`` that
HF and vLLM load and run through their real code paths.

Construction (hidden size H): every layer's ``o_proj`` and ``down_proj`` are zero, so attention
and MLP add nothing and the residual stream at position t is the embedding of token t. Scripted
token x_i gets the basis embedding e_{i+1}, every other token the shared e_0. After the final
RMSNorm (weight 1) the hidden state is sqrt(H) e_j, and with

    lm_head[succ(x_i)] += margin * e_{i+1},    lm_head[default] += margin * e_0

the logits are sqrt(H) * margin at the successor and exactly 0 everywhere else, so greedy
decoding follows the table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoConfig, PreTrainedTokenizerBase, Qwen3ForCausalLM

from common.tinyworld.model import save_model_folder


def successor_table(*paths: Sequence[int]) -> dict[int, int]:
    """The table that makes the model walk each path: path[i] -> path[i + 1].

    A token given two different successors cannot be scripted, and a path that revisits a token
    would loop; both are errors naming the token.
    """
    table: dict[int, int] = {}
    for path in paths:
        repeated = sorted({tok for tok in path if path.count(tok) > 1})
        if repeated:
            raise ValueError(f"path revisits token(s) {repeated}: the walk would loop")
        for cur, nxt in zip(path, path[1:], strict=False):
            if table.setdefault(cur, nxt) != nxt:
                raise ValueError(f"token {cur} would need two successors: {table[cur]} and {nxt}")
    return table


def build_successor_model(
    like: str | Path, table: dict[int, int], default: int, margin: float = 1.0
) -> Qwen3ForCausalLM:
    """An untied Qwen3 with the config of the checkpoint in ``like`` that greedily follows ``table``.

    Unscripted tokens are followed by ``default``. ``margin * sqrt(H)`` is the logit gap.
    """
    config = AutoConfig.from_pretrained(like)
    config.tie_word_embeddings = False
    hidden = config.hidden_size
    if len(table) >= hidden:
        raise ValueError(f"{len(table)} scripted tokens need more than hidden size {hidden}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(config).float()
    basis = {tok: i + 1 for i, tok in enumerate(sorted(table))}  # e_0 is everyone else's
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        embed = model.model.embed_tokens.weight  # [V, H]
        embed.zero_()
        embed[:, 0] = 1.0
        head = model.lm_head.weight  # [V, H]
        head.zero_()
        head[default, 0] = margin
        for tok, j in basis.items():
            embed[tok] = 0.0
            embed[tok, j] = 1.0
            head[table[tok], j] = margin
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model


def greedy_logprob(model: Qwen3ForCausalLM, margin: float = 1.0) -> float:
    """log p of the scripted successor: -log(1 + (V - 1) exp(-g)), g = margin sqrt(H / (1 + eps H)).

    The final RMSNorm maps e_j to e_j / sqrt(1 / H + eps); every other logit is exactly 0.
    """
    cfg = model.config
    gap = margin * math.sqrt(cfg.hidden_size / (1 + cfg.rms_norm_eps * cfg.hidden_size))
    return -math.log1p((cfg.vocab_size - 1) * math.exp(-gap))


def save_successor_model(
    model: Qwen3ForCausalLM, tokenizer: PreTrainedTokenizerBase, folder: str | Path
) -> Path:
    """Write the model and tokenizer as one folder that HF and vLLM load."""
    return save_model_folder(model, tokenizer, folder)
