"""``common.train.engine.dropout_off``: every dropout off, the training mode (and with it HF's
gradient checkpointing) kept, through a ``model.train()`` inside the block, and restored after."""

from __future__ import annotations

import torch
from torch import nn

from common.train.engine import dropout_off, eval_mode


def test_dropout_off_keeps_training_mode_and_survives_a_nested_train_call():
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, attention_dropout=0.5,
    )  # fmt: skip
    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model = nn.Sequential()  # an LM behind a dropout module, as LoRA puts one before its A
    model.add_module("drop", nn.Dropout(0.5))
    ids = torch.randint(0, 64, (2, 12))
    embeds = lm.get_input_embeddings()(ids).detach()

    def logits() -> torch.Tensor:
        return lm(inputs_embeds=model(embeds)).logits

    with eval_mode(lm), eval_mode(model), torch.no_grad():
        expected = logits()
    lm.train()
    model.train()
    with torch.no_grad():
        assert not torch.allclose(logits(), expected)  # dropout on: attention and the module
    with dropout_off(lm), dropout_off(model):
        assert lm.training and model.training
        torch.testing.assert_close(logits(), expected, rtol=0, atol=0)
        with eval_mode(lm):  # a reference forward inside: its exit calls lm.train(True)
            pass
        torch.testing.assert_close(logits(), expected, rtol=0, atol=0)
    assert model.drop.p == 0.5
    assert {m.attention_dropout for m in lm.modules() if hasattr(m, "attention_dropout")} == {0.5}
