"""Batches pad with the tokenizer's pad token, else its end of sequence (Llama 3.2 has no pad
token: ARCO's warmup died on ``torch.full(..., None)``, found by rehearsing its Llama config)."""

from __future__ import annotations

from types import SimpleNamespace

from common.rollout.batch import padding_id


def test_padding_id_falls_back_to_eos_then_zero():
    assert padding_id(SimpleNamespace(pad_token_id=7, eos_token_id=3)) == 7
    assert padding_id(SimpleNamespace(pad_token_id=None, eos_token_id=128009)) == 128009
    assert padding_id(SimpleNamespace(pad_token_id=None, eos_token_id=None)) == 0


def test_the_llama_stand_in_tokenizer_has_no_pad_token_and_pads_with_eot():
    from experiments.rehearse.tokenizers import build_llama32_tokenizer

    tok = build_llama32_tokenizer()
    assert tok.pad_token_id is None
    assert padding_id(tok) == tok.convert_tokens_to_ids("<|eot_id|>") == 128009
