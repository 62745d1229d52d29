"""A tiny Qwen3 causal LM for the tiny world, saved as an ordinary Hugging Face folder."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase, Qwen3Config, Qwen3ForCausalLM

from common.tinyworld.model_sizes import DEFAULT_MODEL_SIZES as DEFAULT_SIZES
from common.tinyworld.tokenizer import EOS_TOKEN, PAD_TOKEN


def padded_vocab_size(n_tokens: int, multiple: int = 64) -> int:
    """`n_tokens` rounded up to a multiple of `multiple` (efficient matmul shapes)."""
    return -(-n_tokens // multiple) * multiple


def build_model(tokenizer: PreTrainedTokenizerBase, seed: int, **sizes: int) -> Qwen3ForCausalLM:
    """A randomly initialised float32 Qwen3 with tied embeddings; `sizes` override DEFAULT_SIZES.

    The initialisation depends on `seed` only; the caller's torch RNG state is left untouched.
    """
    unknown = set(sizes) - set(DEFAULT_SIZES)
    if unknown:
        raise ValueError(
            f"build_model: unknown size(s) {sorted(unknown)}; known: {sorted(DEFAULT_SIZES)}"
        )
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    config = Qwen3Config(
        vocab_size=padded_vocab_size(len(tokenizer)),
        tie_word_embeddings=True,
        bos_token_id=pad_id,  # as in Qwen: no separate BOS, <|endoftext|> stands in
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        **{**DEFAULT_SIZES, **sizes},
    )
    config.dtype = torch.float32
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id
    )
    return model


def save_model_folder(
    model: Qwen3ForCausalLM, tokenizer: PreTrainedTokenizerBase, out: str | Path
) -> Path:
    """Write model (safetensors), configs and tokenizer files into one folder loadable by
    transformers and vLLM."""
    out = Path(out)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    # transformers 5 records its own class name, which transformers 4 (pulled in by some vLLM
    # versions) does not know; the generic name loads in both.
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out
