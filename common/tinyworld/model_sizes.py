"""The tiny Qwen3's sizes (``common.tinyworld.model``) and their check, apart from the model so that
the builder and the CLI list and check them without importing torch."""

from __future__ import annotations

DEFAULT_MODEL_SIZES = {
    "num_hidden_layers": 2,
    "hidden_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 384,
    "max_position_embeddings": 2048,
}


def check_model_sizes(sizes: dict[str, int]) -> None:
    """Raise ``ValueError`` unless every size is a known name with a value >= 1 and the attention
    heads are a multiple of the key-value heads (grouped-query attention)."""
    unknown = sorted(set(sizes) - set(DEFAULT_MODEL_SIZES))
    if unknown:
        raise ValueError(f"unknown model size(s) {unknown}; known: {sorted(DEFAULT_MODEL_SIZES)}")
    bad = [
        f"{k}={v!r}"
        for k, v in sizes.items()
        if isinstance(v, bool) or not isinstance(v, int) or v < 1
    ]
    if bad:
        raise ValueError(f"model sizes must be integers >= 1: {', '.join(bad)}")
    if sizes["num_attention_heads"] % sizes["num_key_value_heads"]:
        raise ValueError(
            f"num_attention_heads ({sizes['num_attention_heads']}) must be a multiple of "
            f"num_key_value_heads ({sizes['num_key_value_heads']})"
        )
