"""Shared fixtures: a small char-level BPE tokenizer and a tiny random Qwen3 over its 97 ids."""

from __future__ import annotations

import pytest
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

VOCAB_SIZE = 97
# Text in the shape of CER responses; "{1" and "{12" are frequent so that BPE learns merges
# that straddle the box's opening brace.
CORPUS = [
    "We add the numbers: 5 + 7 = 12, so the answer is \\boxed{12}.",
    "Half of 2 is 1, hence \\boxed{1} and then {12} {1} {1/2} $\\frac{1}{2}$ 0.5",
    "The total is 3 + 4 = 7. Final answer: \\boxed 7$ or \\fbox{7}",
] * 20


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """BPE over single characters (no byte level), merges learned from CORPUS, 97 ids in all."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - 1,
        special_tokens=["<unk>", "<|endoftext|>"],
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.add_tokens([AddedToken("<|im_end|>", special=True, normalized=False)])
    assert tok.get_vocab_size() == VOCAB_SIZE
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )


@pytest.fixture(scope="session")
def char_tokenizer() -> PreTrainedTokenizerFast:
    return build_char_tokenizer()


@pytest.fixture(scope="session")
def tiny_qwen3() -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(config)
    return model.eval()


@pytest.fixture(scope="session")
def model_that_writes_12(char_tokenizer, tiny_qwen3):
    """The tiny Qwen3 trained to write "so the answer is \\boxed{12}." (30 steps)."""
    model = Qwen3ForCausalLM(tiny_qwen3.config)
    model.load_state_dict(tiny_qwen3.state_dict())
    ids = torch.tensor(
        [char_tokenizer.encode("so the answer is \\boxed{12}.", add_special_tokens=False)]
    )
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ops this small only wait on each other across threads
    try:
        for _ in range(30):
            loss = model(input_ids=ids, labels=ids).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()
